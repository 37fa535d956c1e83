"""The embedding models of the zoo, without a job: census wide & deep's CSV parsing, DeepFM's
records and the click-log generator. (Training them is tests/e2e/test_embeddings.py.)"""

import numpy as np
import pytest
import tensorflow as tf

from elastic_keras.common.model_spec import Mode, load_model_spec
from elastic_keras.data.reader import Metadata, open_reader
from elastic_keras.layers import ps_tables
from model_zoo.deepfm import generate
from tests.conftest import ROOT

ZOO = str(ROOT / "model_zoo")

CENSUS_HEADER = ("income", "age", "workclass", "fnlwgt", "education", "educational-num",
                 "marital-status", "occupation", "relationship", "race", "gender",
                 "capital-gain", "capital-loss", "hours-per-week", "native-country")
CENSUS_LINES = [
    " >50K., 50, Self-emp-inc, 100000, Masters, 14, Married-civ-spouse, Exec-managerial, "
    "Husband, White, Male, 15024, 0, 60, United-States",
    "<=50K,22,Private,200000,HS-grad,9,Never-married,Sales,Own-child,Black,Female,0,0,20,?",
    '">50K",40,"Private",150000,"Bachelors",13,"Divorced","Prof-specialty","Unmarried",'
    '"White","Female",0,1902,45,"Canada"',
    "<=50K.,30,Private,180000,11th,7,Separated,Other-service,Unmarried,White,Male,0,0,40,Mexico",
]


def _census(lines, header=CENSUS_HEADER, mode=Mode.TRAINING):
    spec = load_model_spec(ZOO, "census.wide_deep")
    metadata = Metadata(path="<memory>", format="csv", num_records=len(lines),
                        column_names=header)
    dataset = spec.dataset_fn(tf.data.Dataset.from_tensor_slices(lines), mode, metadata)
    return spec, next(iter(dataset.batch(len(lines))))


def test_census_parses_columns_by_header_and_cleans_labels():
    _, (features, labels) = _census(CENSUS_LINES)
    np.testing.assert_array_equal(labels.numpy(), [[1], [0], [1], [0]])
    assert features["workclass"].numpy().tolist() == [b"Self-emp-inc", b"Private", b"Private",
                                                      b"Private"]
    assert features["native_country"].numpy()[1] == b"?"
    np.testing.assert_allclose(features["age"].numpy(), [50, 22, 40, 30])
    np.testing.assert_allclose(features["capital_loss"].numpy(), [0, 0, 1902, 0])
    assert set(features) == {name.replace("-", "_") for name in CENSUS_HEADER} - {"income"}


def test_census_model_serves_probabilities_and_uses_two_ps_tables():
    spec, (features, _) = _census(CENSUS_LINES)
    model = spec.custom_model()
    probabilities = model(features).numpy()
    assert probabilities.shape == (4, 1)
    assert np.all((probabilities > 0) & (probabilities < 1))
    assert [(t.name, t.dim, t.input_dim) for t in ps_tables(model)] == [("deep", 8, 0),
                                                                        ("wide", 1, 0)]
    _, predicted = _census(CENSUS_LINES, mode=Mode.PREDICTION)
    assert isinstance(predicted, dict) and "income" not in predicted


def test_census_names_missing_columns():
    with pytest.raises(ValueError, match=r"missing \['age'\]"):
        _census(["<=50K"], header=tuple(h for h in CENSUS_HEADER if h != "age"))


def test_generator_writes_criteo_shaped_examples(tmp_path):
    files, click_rate = generate.generate(str(tmp_path / "a"), 3_000, num_shards=2,
                                          vocab_size=500, seed=3)
    assert len(files) == 2 and 0.15 < click_rate < 0.5
    again, _ = generate.generate(str(tmp_path / "b"), 3_000, num_shards=2, vocab_size=500,
                                 seed=3)
    assert [open(f, "rb").read() for f in files] == [open(f, "rb").read() for f in again]

    spec = load_model_spec(ZOO, "deepfm.deepfm")
    reader = open_reader(files[0])
    records = tf.constant(list(reader.read(0, reader.num_records)))
    features, labels = next(iter(spec.minibatches(
        tf.data.Dataset.from_tensor_slices(records), Mode.TRAINING, reader.metadata, 5000)))
    assert features["dense"].shape == (1_500, 13) and features["cat"].shape == (1_500, 26)
    assert labels.shape == (1_500, 1)
    predicted = next(iter(spec.minibatches(
        tf.data.Dataset.from_tensor_slices(records), Mode.PREDICTION, reader.metadata, 7)))
    np.testing.assert_array_equal(predicted["cat"], features["cat"][:7])
    cat = features["cat"].numpy()
    # Each field's ids are hashes of its own values: no id is shared by two fields.
    per_field = [set(cat[:, f].tolist()) for f in range(26)]
    assert sum(len(s) for s in per_field) == len(set().union(*per_field))
    # Zipf: the most popular value of a field is far more common than the median one.
    _, counts = np.unique(cat[:, 0], return_counts=True)
    assert counts.max() > 20 * np.median(counts)
    model = spec.custom_model()
    assert model(features).shape == (1_500, 1)
    assert sorted((t.name, t.dim, t.input_dim) for t in ps_tables(model)) == [
        ("fm_factors", 16, 0), ("fm_linear", 1, 0)]


def test_hidden_click_model_is_learnable_and_independent_of_the_row_seed():
    model = generate.HiddenModel(vocab_size=1_000)
    dense, cat, values, labels = model.draw(20_000, np.random.default_rng(5))
    probabilities = generate.hidden_probabilities(dense, cat, vocab_size=1_000)
    np.testing.assert_allclose(probabilities, 1 / (1 + np.exp(-model.logits(dense, values))))
    positives = probabilities[labels == 1]
    negatives = probabilities[labels == 0]
    pairs = np.random.default_rng(0).integers(0, [len(positives), len(negatives)], (20_000, 2))
    auc = np.mean(positives[pairs[:, 0]] > negatives[pairs[:, 1]])
    assert auc > 0.8
    other = generate.HiddenModel(vocab_size=1_000)
    np.testing.assert_array_equal(other.weights, model.weights)
    np.testing.assert_array_equal(other.ids, model.ids)


def test_generator_command_checks_its_flags(tmp_path, capsys):
    assert generate.main(["--output", str(tmp_path), "--rows", "2", "--num-shards", "3"]) == 2
    assert "num_shards=3" in capsys.readouterr().err
