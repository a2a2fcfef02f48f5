import math

import pytest

from toolkit.identity import canonical_json, content_digest, file_task_key, idem_key, task_key

OPTIONS = {"target": "de", "engine": "v2", "ocr": {"mode": "auto", "dpi": 300}}


def test_reordered_options_give_the_same_task_key():
    reordered = {"ocr": {"dpi": 300, "mode": "auto"}, "engine": "v2", "target": "de"}
    assert task_key("d" * 64, OPTIONS) == task_key("d" * 64, reordered)


@pytest.mark.parametrize("change", [
    {"target": "fr"},                      # changed value
    {"glossary": "rev-7"},                 # added option
    {"ocr": {"mode": "auto", "dpi": 301}},  # nested change
    {"engine": "v2 "},                     # whitespace inside a value counts
])
def test_any_option_that_changes_the_result_changes_the_task_key(change):
    assert task_key("d" * 64, OPTIONS) != task_key("d" * 64, {**OPTIONS, **change})


def test_one_changed_byte_of_content_changes_the_task_key(tmp_path):
    a, b = tmp_path / "a.pdf", tmp_path / "b.pdf"
    a.write_bytes(b"%PDF-1.7 hello")
    b.write_bytes(b"%PDF-1.7 hellp")
    assert file_task_key(a, OPTIONS) != file_task_key(b, OPTIONS)


def test_renamed_file_keeps_its_task_key(tmp_path):
    original = tmp_path / "invoice.pdf"
    original.write_bytes(b"%PDF-1.7 same bytes")
    before = file_task_key(original, OPTIONS)
    renamed = original.rename(tmp_path / "renamed-copy.pdf")
    assert file_task_key(renamed, OPTIONS) == before


def test_content_digest_of_path_equals_digest_of_bytes(tmp_path):
    path = tmp_path / "big.bin"
    data = bytes(range(256)) * 9000  # several read chunks
    path.write_bytes(data)
    assert content_digest(path) == content_digest(data)


def test_canonical_json_is_compact_and_sorted():
    assert canonical_json({"b": 1, "a": [True, None, 1.5]}) == '{"a":[true,null,1.5],"b":1}'


@pytest.mark.parametrize("value, path", [
    ({"x": math.nan}, "options['x']"),
    ({"x": [1, math.inf]}, "options['x'][1]"),
    ({"x": {1, 2}}, "options['x']"),
    ({"x": b"raw"}, "options['x']"),
    ({"x": (1, 2)}, "options['x']"),
    ({"x": {3: "int key"}}, "options['x']"),
])
def test_non_json_native_option_is_a_type_error_naming_its_path(value, path):
    with pytest.raises(TypeError, match=__import__("re").escape(path)):
        task_key("d" * 64, value)


def test_idempotency_key_is_fresh_per_attempt_and_rejects_attempt_zero():
    key = task_key("d" * 64, OPTIONS)
    assert idem_key(key, 1) != idem_key(key, 2)
    assert idem_key(key, 1).startswith(key)
    with pytest.raises(ValueError):
        idem_key(key, 0)
