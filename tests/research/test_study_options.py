"""The light names of the paper study are the study's own: same summary, profiles and methods."""

from __future__ import annotations

from fedfair.research import profiles, reproduce
from fedfair.research.study_options import PROFILE_NAMES, STUDY_METHODS, STUDY_SUMMARY


def test_the_study_options_are_the_studys_profiles_methods_and_summary() -> None:
    assert tuple(sorted(profiles.PROFILES)) == PROFILE_NAMES
    assert tuple(reproduce.METHOD_LABELS) == STUDY_METHODS
    assert reproduce.__doc__ is not None and reproduce.__doc__.split("\n\n")[0] == STUDY_SUMMARY
