"""scripts/index_flush.py, which the README cites for what a round's index writes cost: on a redis-server of its own,
one round trip a commit against the writer's one batch, counted at the client's socket."""

import re

from tests.readme import run_script


def test_one_batch_is_one_round_trip_where_commits_one_by_one_are_one_each():
    out = run_script("scripts/index_flush.py", "3")
    rows = re.findall(r"^(one by one|one batch ) +3 commits: (\d+) round trips, wall ([\d.]+) / ([\d.]+) ms", out, re.M)
    assert {(form.strip(), int(trips)) for form, trips, _, _ in rows} == {("one by one", 3), ("one batch", 1)}
    for _, _, best, median in rows:
        assert 0 < float(best) <= float(median)
