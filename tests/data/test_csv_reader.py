"""CSV records: the header, line endings, empty lines and a missing final newline."""

import pytest

from elastic_keras.common.errors import DataError
from elastic_keras.data import csv_reader
from elastic_keras.data.csv_reader import CSVReader


def _reader(tmp_path, content, name="a.csv"):
    path = tmp_path / name
    path.write_bytes(content)
    return CSVReader(str(path))


def _all(reader):
    return list(reader.read(0, reader.num_records))


def test_header_becomes_column_names(tmp_path):
    reader = _reader(tmp_path, b'age, "income group",label\n1,2,3\n')
    assert reader.metadata.column_names == ("age", "income group", "label")
    assert reader.metadata.format == "csv"
    assert _all(reader) == [b"1,2,3"]


def test_byte_order_mark_is_dropped(tmp_path):
    reader = _reader(tmp_path, b"\xef\xbb\xbfa,b\n1,2\n")
    assert reader.metadata.column_names == ("a", "b")


def test_crlf_line_endings(tmp_path):
    reader = _reader(tmp_path, b"a,b\r\n1,2\r\n3,4\r\n")
    assert _all(reader) == [b"1,2", b"3,4"]


def test_missing_final_newline(tmp_path):
    assert _all(_reader(tmp_path, b"a,b\n1,2\n3,4")) == [b"1,2", b"3,4"]
    assert _all(_reader(tmp_path, b"a,b\r\n1,2\r\n3,4", "b.csv")) == [b"1,2", b"3,4"]


def test_empty_lines_are_not_records(tmp_path):
    reader = _reader(tmp_path, b"a,b\n1,2\n\n\r\n3,4\n\n\r\n\n")
    assert reader.num_records == 2
    assert _all(reader) == [b"1,2", b"3,4"]
    assert list(reader.read(1, 2)) == [b"3,4"]


def test_trailing_carriage_return_only_line(tmp_path):
    assert _all(_reader(tmp_path, b"a\n1\n\r")) == [b"1"]


def test_header_only_file_has_no_records(tmp_path):
    assert _reader(tmp_path, b"a,b\n").num_records == 0
    assert _reader(tmp_path, b"a,b", "b.csv").num_records == 0


def test_quoted_commas_stay_inside_the_record(tmp_path):
    assert _all(_reader(tmp_path, b'a,b\n"x, y",2\n')) == [b'"x, y",2']


@pytest.mark.parametrize("content, message", [
    (b"", "starts with an empty line"),
    (b"\n1,2\n", "starts with an empty line"),
    (b"a,a\n1,2\n", "must be unique; a repeat"),
    (b"a,,c\n1,2,3\n", "column 1 has none"),
])
def test_bad_header_is_a_data_error(tmp_path, content, message):
    with pytest.raises(DataError, match=f"{message}.*Received:"):
        _reader(tmp_path, content)


def test_records_across_scan_and_read_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(csv_reader, "_SCAN_BLOCK", 7)
    monkeypatch.setattr(csv_reader, "_READ_BLOCK", 10)
    lines = [f"{i},{'x' * (i % 13)}".encode() for i in range(200)]
    content = b"id,text\r\n" + b"\r\n".join(lines[:100]) + b"\r\n\r\n" + b"\n".join(lines[100:])
    reader = _reader(tmp_path, content)
    assert _all(reader) == lines
    assert list(reader.read(97, 104)) == lines[97:104]


def test_a_record_is_described_by_its_index_and_line(tmp_path):
    reader = _reader(tmp_path, b"a,b\r\n1,2\r\n\r\n\n3,4\n5,6")
    assert [reader.describe_record(i) for i in range(3)] == [
        f"record 0 of {tmp_path / 'a.csv'} (line 2)",
        f"record 1 of {tmp_path / 'a.csv'} (line 5)",  # empty lines are not records
        f"record 2 of {tmp_path / 'a.csv'} (line 6)",  # no final newline
    ]
