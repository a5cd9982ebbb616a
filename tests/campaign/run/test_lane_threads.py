"""The CPU lane's threads per trial as a run plans them: from the campaign file's trial count, and once per workdir
(a later run keeps the count the first run chose, since a thread count can change a training's numbers)."""

from __future__ import annotations

import json
import sqlite3

from gpufill.campaign.executors.local import plan_on
from gpufill.campaign.policy.lanes import MAX_AUTO_THREADS
from gpufill.campaign.run.runner import CPU_THREADS_KEY, Campaign
from gpufill.campaign.store.store import Store
from gpufill.cpus import usable_cpus
from tests.helpers import write_campaign


class Planner:
    """An executor that only plans (4 cores, no GPU), keeping what it was asked."""

    def __init__(self):
        self.requests = []

    def plan(self, request):
        self.requests.append(request)
        return plan_on(request, cores=4, gpu_memory_bytes=None)

    def hand_data(self, projects):
        pass

    def warm(self, lanes, check=None):
        pass


def lanes_of(path, workdir, planner, **kwargs):
    return [(lane.slots, lane.threads) for lane in Campaign.from_yaml(path, workdir).prepare(executor=planner, **kwargs).lanes]


def test_the_lanes_are_planned_on_the_file_s_trial_count(tmp_path):
    planner = Planner()
    one = write_campaign(tmp_path, models="mlp: {hidden_size: 8}", projects=1)
    assert lanes_of(one, tmp_path / "w1", planner) == [(1, 4)]
    assert dict(planner.requests[-1].trial_counts) == {"neural": 1} and planner.requests[-1].cpu_threads_before is None
    many = write_campaign(tmp_path, name="many", models="mlp: {hidden_size: [8, 16]}\n  linear: {}", projects=2)
    assert lanes_of(many, tmp_path / "w2", planner) == [(4, 1)]
    assert dict(planner.requests[-1].trial_counts) == {"neural": 4, "classical": 2}


def test_a_later_run_keeps_the_threads_the_workdir_s_first_run_chose(tmp_path):
    planner = Planner()
    many = write_campaign(tmp_path, models="mlp: {hidden_size: [8, 16]}\n  linear: {}", projects=2)
    workdir = tmp_path / "w"
    store = Store.create(workdir)
    store.set_meta({CPU_THREADS_KEY: "2"})  # the first run had a trial or two
    store.close()
    assert lanes_of(many, workdir, planner) == [(2, 2)]  # six trials now, at the first run's 2 threads each
    assert lanes_of(many, workdir, planner, fresh=True) == [(4, 1)]  # --fresh: the store goes, the choice is made again


def test_a_workdir_run_before_the_choice_was_kept_trains_at_one_thread(tmp_path):
    planner = Planner()
    one = write_campaign(tmp_path, models="mlp: {hidden_size: 8}", projects=1)
    workdir = tmp_path / "w"
    store = Store.create(workdir)
    store.begin_run("gpufill run")  # a run, and no cpu_threads: an older gpufill's, whose trials all had one thread
    store.close()
    assert lanes_of(one, workdir, planner) == [(4, 1)]


def test_the_first_run_stores_its_choice_and_an_edited_file_trains_at_it(tmp_path):
    path = write_campaign(tmp_path, models="mlp: {hidden_size: 8}", projects=1, epochs=1)
    workdir = tmp_path / "w"
    outcome = Campaign.from_yaml(path, workdir).run(executor="inline")
    assert outcome.done == 1
    chosen = min(MAX_AUTO_THREADS, usable_cpus())
    with sqlite3.connect(workdir / "gpufill.db") as db:
        stored = db.execute("SELECT value FROM meta WHERE key = ?", (CPU_THREADS_KEY,)).fetchone()[0]
        plan = json.loads(db.execute("SELECT plan FROM trials").fetchone()[0])
    assert stored == str(chosen) and plan["threads"]["value"] == chosen  # the trial trained at what was stored
    path.write_text(path.read_text().replace("mlp: {hidden_size: 8}", "mlp: {hidden_size: [8, 16, 32, 64, 128]}"))
    lanes = Campaign.from_yaml(path, workdir).prepare().lanes
    assert [lane.threads for lane in lanes] == [chosen]  # five trials now, still the first run's count
