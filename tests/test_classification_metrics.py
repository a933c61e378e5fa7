import pytest
from scratchflow.classification import classification_metrics


def test_metrics_match_a_hand_computed_example():
    truth = ["a", "a", "a", "b", "b", "c"]
    predicted = ["a", "a", "b", "b", "c", "c"]
    metrics = classification_metrics(truth, predicted, ["a", "b", "c"])
    assert metrics["accuracy"] == pytest.approx(4 / 6)
    assert metrics["confusion_matrix"]["rows_true_columns_predicted"] == [[2, 1, 0], [0, 1, 1], [0, 0, 1]]
    a, b, c = (metrics["per_class"][label] for label in "abc")
    assert (a["precision"], a["recall"]) == (1.0, pytest.approx(2 / 3))
    assert (b["precision"], b["recall"]) == (0.5, 0.5)
    assert (c["precision"], c["recall"], c["support"]) == (0.5, 1.0, 1)
    f1 = [2 * p * r / (p + r) for p, r in [(1, 2 / 3), (0.5, 0.5), (0.5, 1.0)]]
    assert metrics["macro_f1"] == pytest.approx(sum(f1) / 3)


def test_a_class_never_predicted_scores_zero_not_nan():
    metrics = classification_metrics(["a", "b"], ["a", "a"], ["a", "b"])
    assert metrics["per_class"]["b"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
