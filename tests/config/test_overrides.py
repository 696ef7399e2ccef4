import pytest

from primus.config.errors import ConfigError
from primus.config.overrides import overrides_layer, parse_overrides


def test_all_three_forms_and_yaml_values():
    items = parse_overrides(["a.b=3", "--c.d", "[1, 2]", "--e=true", "--flag", "--s", "text", "lr=3e-4"])
    assert [(k, v) for k, v, _ in items] == [("a.b", 3), ("c.d", [1, 2]), ("e", True), ("flag", True), ("s", "text"),
                                            ("lr", 3e-4)]


def test_layer_nests_keys_and_remembers_tokens():
    layer = overrides_layer(parse_overrides(["training.steps=5", "--training.seq_len", "64"]))
    assert layer.data == {"training": {"steps": 5, "seq_len": 64}}
    assert layer.origins["training.seq_len"] == "command line '--training.seq_len 64'"


@pytest.mark.parametrize("tokens, message", [
    (["steps"], "is not an override"),
    (["a..b=1"], "is not a dotted key"),
    (["a=[1, 2"], "cannot parse the value"),
])
def test_bad_overrides_are_one_line_errors(tokens, message):
    with pytest.raises(ConfigError, match=message):
        parse_overrides(tokens)
