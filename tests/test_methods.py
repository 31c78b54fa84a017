"""The method-spec language (oilbird.methods): names, overrides, FLy's part and budgets."""

import pytest

from oilbird.bench import BenchConfig
from oilbird.errors import ConfigError


def test_method_specs_carry_config_overrides():
    from oilbird.methods import build_drafter, split_methods

    config = BenchConfig(methods="goose,oilbird[sem_entry_budget=0;sem_floor=false]@auto,oilbird", budget="60")
    assert [v[0] for v in config.variants()] == [
        "ar", "goose", "oilbird[sem_entry_budget=0;sem_floor=false]@auto", "oilbird"]
    drafter = build_drafter("oilbird[sem_entry_budget=0;sem_floor=false]", {})
    assert drafter.config.sem_entry_budget == 0 and drafter.config.sem_floor is False
    assert build_drafter("oilbird", {}).config.sem_entry_budget > 0
    assert split_methods("a[x=1,2],b") == ["a[x=1,2]", "b"]


@pytest.mark.parametrize("methods, complaint", [
    ("oilbird[sem_nothing=1]", "no config field 'sem_nothing'"),
    ("oilbird[sem_top_k=many]", "expected int"),
    ("oilbird[sem_top_k=0]", "sem_top_k"),
    ("oilbird[sem_top_k]", "not field=value"),
    ("hf-pld[x=1]", "only drafters take config overrides"),
])
def test_bad_method_specs_say_what_is_wrong(methods, complaint):
    with pytest.raises(ConfigError, match=complaint):
        BenchConfig(methods=methods).method_list()


def test_fly_specs_split_into_the_drafter_and_the_rule():
    from oilbird.methods import fly_config, parse_spec
    from oilbird.fly import FlyConfig

    assert parse_spec("draft+fly[k=10;fly_window=4]") == ("draft", {"k": "10"})
    assert fly_config("draft+fly[k=10;fly_window=4;fly_entropy=normalized]") == FlyConfig(window=4, entropy="normalized")
    assert fly_config("pld+fly") == FlyConfig() and fly_config("pld") is None
    for spec, message in [("pld[fly_window=4]", "need the FLy rule"), ("pld+fly[fly_gate=1]", "no config field"),
                          ("pld+fly[fly_window=x]", "expected int"), ("pld+fly[fly_entropy=renyi]", "entropy")]:
        with pytest.raises(ConfigError, match=message):
            fly_config(spec)
    with pytest.raises(ConfigError, match="only drafters"):
        BenchConfig(methods="hf-pld+fly").method_list()
    assert BenchConfig(methods="pld+fly[fly_theta=0.6],pld").method_list() == ["ar", "pld+fly[fly_theta=0.6]", "pld"]
