"""Rule sets: defaults from the guidelines, hashing, overrides, errors located by key and line."""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path

import pytest
from _rules_kit import count_table

from safeaccess.rules.engine import DEFAULT_RULESET, RuleSet, check
from safeaccess.rules.ruleset import RuleSetError, load_ruleset


def test_default_follows_dwb_sdap_as_encoded_by_acro() -> None:
    # values from ACRO 1.0.2 default.yaml and the DwB rule of thumb, typed in by hand
    rs = DEFAULT_RULESET
    assert (rs.threshold, rs.dof, rs.nk_n, rs.nk_k, rs.p_ratio) == (10, 10, 2, 0.9, 0.1)
    assert rs.zeros_disclosive is True
    assert rs.class_disclosure == 0.9
    assert rs.missing_values == "ignore"  # ACRO's code default (check_missing_values: False)
    assert rs.negative_values == "review"
    assert rs.label == "default@1"


def test_default_yaml_ships_inside_the_package() -> None:
    text = resources.files("safeaccess.rules").joinpath("rulesets/default.yaml").read_text()
    assert load_ruleset(text) == DEFAULT_RULESET


def test_content_hash_is_sha256_of_canonical_json() -> None:
    # recomputed independently from the field values, not from model_dump
    rs = RuleSet(name="x", version="2", threshold=5)
    fields = {
        "name": "x", "version": "2", "description": "", "threshold": 5, "dof": 10, "nk_n": 2,
        "nk_k": 0.9, "spread_n": 2, "spread_k": 0.9, "max_quantiles": 19, "p_ratio": 0.1, "zeros_disclosive": True, "class_disclosure": 0.9,
        "missing_values": "ignore", "negative_values": "review", "extremes": "withhold",
        "survival_threshold": 10, "reconstruction": True,
        "reconstruction_max_states": 200_000, "reconstruction_time_budget": 2.0,
        "withhold_budget": {"count": 25, "days": 30}, "leverage_limit": None,
        "model_mia_auc_limit": 0.6, "model_fairness_limit": None,
        "model_fairness_action": "report", "model_max_depth": None, "model_max_leaves": None,
        "model_max_estimators": None, "model_max_features": None,
        "synth_attack_excess_withhold": 0.05, "synth_attack_excess_review": 0.02,
        "synth_certain_correct_withhold": 0.05, "synth_full_row_uniques_review": 0.01,
        "synth_full_row_uniques_withhold": 0.03, "synth_dcr_close_review": 0.02,
        "synth_dcr_close_withhold": 0.05, "synth_yp_y": "loo_q05", "synth_yp_p": 0.10,
        "synth_p_privacy_tau": 0.9, "synth_max_keysets": 20, "synth_max_cells": 100_000,
        "synth_max_model_cells": 10_000_000, "synth_max_rows": 1_000_000,
        "synth_hungarian_max": 5000, "synth_action_on_check_error": "review",
    }  # fmt: skip
    expected = hashlib.sha256(
        json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    assert rs.content_hash() == expected
    assert RuleSet(name="x", version="2", threshold=6).content_hash() != expected


def test_decision_records_ruleset_label_and_hash() -> None:
    rs = DEFAULT_RULESET.with_overrides({"name": "eustat", "threshold": 3})
    d = check(count_table([[12, 11]], ["N"], ["F", "M"]), rs)
    assert d.ruleset == "eustat@1"
    assert d.ruleset_hash == rs.content_hash() != DEFAULT_RULESET.content_hash()


def test_eustat_override_file_lowers_threshold_to_three() -> None:
    path = Path(
        str(resources.files("safeaccess.rules").joinpath("rulesets/eustat_population.yaml"))
    )
    rs = load_ruleset(path, base=DEFAULT_RULESET)
    assert rs.threshold == 3 and rs.name == "eustat-population"
    assert rs.nk_k == DEFAULT_RULESET.nk_k  # untouched keys keep the base's values
    table = count_table([[4, 25], [2, 30]], ["A", "B"], ["F", "M"])
    # 4 >= 3 passes under Eustat but not under the default; 2 < 3 fails under both
    flagged = {(f.check, f.item) for f in check(table, rs).findings}
    assert ("threshold", "region=B, sex=F") in flagged
    assert ("threshold", "region=A, sex=F") not in flagged
    assert ("threshold", "region=A, sex=F") in {(f.check, f.item) for f in check(table).findings}


def test_override_without_name_is_not_labelled_as_the_base() -> None:
    rs = load_ruleset("threshold: 5\n", base=DEFAULT_RULESET)
    assert rs.name == "default+overrides"


def test_numeric_version_is_read_as_text() -> None:
    assert load_ruleset("version: 2\n").version == "2"


def test_path_given_as_string(tmp_path: Path) -> None:
    f = tmp_path / "site.yaml"
    f.write_text("name: site\nversion: '7'\ndof: 20\n")
    rs = load_ruleset(str(f))
    assert (rs.name, rs.version, rs.dof) == ("site", "7", 20)


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        ("name: a\nthreshold: 0\n", "threshold", 2),  # below the minimum of 1
        ("name: a\n\nnk_k: 1.5\n", "nk_k", 3),  # a share above 1
        ("name: a\nthreshhold: 5\n", "threshhold", 2),  # misspelt key
        ("threshold: 5\ndof: 3\nthreshold: 6\n", "threshold", 3),  # duplicate
        ("nk_n: 4\n", "nk_n", 1),  # facts keep only the three largest
        ("missing_values: drop\n", "missing_values", 1),
        ("dof: 5\nthreshold: yes\n", "threshold", 2),  # YAML yes is a boolean, not a count
        ("zeros_disclosive: 0\n", "zeros_disclosive", 1),  # strict: say true or false
    ],
)
def test_invalid_files_name_key_and_line(text: str, key: str, line: int) -> None:
    with pytest.raises(RuleSetError) as err:
        load_ruleset(text)
    assert err.value.key == key
    assert err.value.line == line
    assert f"line {line}" in str(err.value) and key in str(err.value)


def test_invalid_override_names_key_and_line() -> None:
    with pytest.raises(RuleSetError) as err:
        load_ruleset("name: x\np_ratio: -1\n", base=DEFAULT_RULESET)
    assert (err.value.key, err.value.line) == ("p_ratio", 2)


def test_syntax_error_and_non_mapping_report_a_line() -> None:
    with pytest.raises(RuleSetError) as err:
        load_ruleset("threshold: [1, 2\n")
    assert err.value.line is not None
    with pytest.raises(RuleSetError) as err2:
        load_ruleset("- threshold\n")
    assert err2.value.line == 1


def test_with_overrides_rejects_unknown_and_leaves_base_unchanged() -> None:
    before = DEFAULT_RULESET.content_hash()
    with pytest.raises(RuleSetError, match="colour"):
        DEFAULT_RULESET.with_overrides({"colour": "red"})
    with pytest.raises(RuleSetError) as err:
        DEFAULT_RULESET.with_overrides({"dof": -1})
    assert err.value.key == "dof"
    assert DEFAULT_RULESET.content_hash() == before


def test_synth_settings_are_typed_fields_read_through_synth_rules() -> None:
    # the defaults of docs/synthetic.md (part B, section 8), typed in by hand
    rules = DEFAULT_RULESET.synth_rules
    assert (rules.synth_attack_excess_withhold, rules.synth_attack_excess_review) == (0.05, 0.02)
    assert (rules.synth_full_row_uniques_review, rules.synth_full_row_uniques_withhold) == (
        0.01,
        0.03,
    )
    assert (rules.synth_dcr_close_review, rules.synth_dcr_close_withhold) == (0.02, 0.05)
    assert rules.synth_yp_y == "loo_q05" and rules.synth_max_cells == 100_000
    assert rules.synth_action_on_check_error == "review"
    rs = load_ruleset("synth_attack_excess_withhold: 0.08\nsynth_yp_y: 1\n", base=DEFAULT_RULESET)
    assert rs.synth_rules.synth_attack_excess_withhold == 0.08
    assert rs.synth_rules.synth_yp_y == 1.0
    assert rs.content_hash() != DEFAULT_RULESET.content_hash()


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("synth_attack_excess_review: 0.2\n", "synth_attack_excess_review"),
        ("synth_action_on_check_error: release\n", "synth_action_on_check_error"),
        ("synth_yp_y: near\n", "synth_yp_y"),
        ("synth_max_rows: 0\n", "synth_max_rows"),
    ],
)
def test_bad_synth_settings_are_named(text: str, key: str) -> None:
    with pytest.raises(RuleSetError) as info:
        load_ruleset(text, base=DEFAULT_RULESET)
    assert key in str(info.value) or info.value.key == key
