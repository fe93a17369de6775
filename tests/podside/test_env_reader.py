"""The pod scripts' one reader of settings from the environment (podside/common/env.py): every
problem is collected and named, never a ValueError traceback, in each script that uses it."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from warmstart.podside.common.env import EnvReader
from warmstart.podside.compile_cache import settings as cache_settings
from warmstart.podside.weights_import import settings as import_settings
from warmstart.podside.weights_stage import settings as stage_settings


def test_every_problem_is_named_and_the_defaults_stand_in():
    read = EnvReader({"A": " x ", "N": "ten", "M": "-1", "F": "0.5"})
    assert read.text("A") == "x" and read.text("B", "d") == "d"
    assert read.text("REQ", required=True) == ""
    assert read.number("N", 3, integer=True) == 3 and isinstance(read.number("N", 3, integer=True), int)
    assert read.number("M", 1, integer=True, minimum=0) == -1
    assert read.number("F", 1) == 0.5 and read.number("UNSET", 2) == 2.0
    assert read.problems == ["REQ is not set", "N='ten' is not an integer", "N='ten' is not an integer",
                             "M='-1' must be >= 0"]


@given(st.text(alphabet="0123456789.-e+x ", max_size=8))
def test_a_number_is_read_or_named_never_raised(raw):
    read = EnvReader({"V": raw})
    value = read.number("V", 7)
    assert isinstance(value, float)
    assert read.problems == [] or read.problems[0].startswith("V=")


def test_the_stager_names_a_bad_number_instead_of_a_traceback():
    env = {"WARMSTART_WEIGHTS_SOURCE": "s3://b/p", "WARMSTART_WEIGHTS_DIGEST": "d1",
           "WARMSTART_STAGE_WORKERS": "many", "WARMSTART_POLL_S": "1s"}
    with pytest.raises(stage_settings.StageRefused) as err:
        stage_settings.Settings.from_env(env)
    assert "WARMSTART_STAGE_WORKERS='many' is not an integer" in str(err.value)
    assert "WARMSTART_POLL_S='1s' is not a number" in str(err.value)


@pytest.mark.parametrize("module, env", [
    (cache_settings, {"WARMSTART_CACHE_PREFIX": "p/", "WARMSTART_MODEL": "m", "WARMSTART_IMAGE": "i",
                      "WARMSTART_TP": "two"}),
    (import_settings, {"WARMSTART_DEST_PREFIX": "p", "WARMSTART_MODEL": "m", "WARMSTART_DEST_BUCKET": "b",
                       "WARMSTART_WEIGHTS_GIB": "1", "WARMSTART_SOURCE_S3": "s3://src/x",
                       "WARMSTART_MAX_CONCURRENCY": "two"}),
])
def test_the_cache_restore_and_the_import_name_a_bad_number(module, env):
    with pytest.raises(module.ConfigError) as err:
        module.Settings.from_env(env)
    assert "is not an integer" in str(err.value)
