"""The `elastic-keras data` command: arguments, summary lines and exit codes."""

import argparse

import pytest

from elastic_keras.data import command


def _run(argv):
    parser = argparse.ArgumentParser(prog="elastic-keras")
    command.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["data", *argv])
    assert args.func is command.run
    return args.func(args)


def test_converts_and_prints_one_line_per_directory(tmp_path, capsys):
    source = tmp_path / "a.csv"
    source.write_text("x,label\n" + "".join(f"{i},{i % 2}\n" for i in range(10)))
    code = _run([str(source), "--output", str(tmp_path / "out"), "--num-shards", "2",
                 "--holdout-every", "5", "--shuffle", "--seed", "3"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out == [f"{tmp_path / 'out' / 'train'}: 2 tfrecord files, 8 rows",
                   f"{tmp_path / 'out' / 'test'}: 2 tfrecord files, 2 rows"]


def test_csv_format_with_column_names(tmp_path, capsys):
    source = tmp_path / "a.csv"
    source.write_text("1,2,0\n3,4,1\n")
    code = _run([str(source), "--output", str(tmp_path / "out"), "--no-header",
                 "--column-names", "pixels:2, label", "--format", "csv"])
    assert code == 0
    written = (tmp_path / "out" / "data-00000-of-00001.csv").read_text()
    assert written == "pixels_0,pixels_1,label\n1,2,0\n3,4,1\n"


@pytest.mark.parametrize("argv, message", [
    (["MISSING.csv"], "does not exist. Received: 'MISSING.csv'"),
    (["sklearn:nope"], "Unknown data set name.*Received: 'sklearn:nope'"),
    (["RAGGED"], "must have 2 fields; data row 1"),
    (["GOOD", "--holdout-every", "1"], "--holdout-every must be 2 or more.*Received: 1"),
    (["GOOD", "--num-shards", "0"], "--num-shards must be a positive integer.*Received: 0"),
    (["GOOD", "--num-shards", "9"], "number of shards.*Received: num_shards=9"),
    (["GOOD", "--column-names", "a,,b"], "--column-names must not hold an empty name"),
])
def test_bad_input_exits_with_2(tmp_path, capsys, argv, message):
    (tmp_path / "ragged.csv").write_text("a,b\n1,2\n3\n")
    (tmp_path / "good.csv").write_text("a,b\n1,2\n3,4\n")
    names = {"RAGGED": str(tmp_path / "ragged.csv"), "GOOD": str(tmp_path / "good.csv")}
    argv = [names.get(a, a) for a in argv]
    code = _run([*argv, "--output", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert captured.err.startswith("elastic-keras data: error: ")
    assert __import__("re").search(message, captured.err), captured.err


def test_main_runs_standalone(tmp_path, capsys):
    assert command.main(["data", "sklearn:nope", "--output", str(tmp_path)]) == 2
