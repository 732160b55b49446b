"""Every seed the differential fuzzer (``lifeline bench fuzz``) ever failed on, kept as a named regression case.

Each entry replays exactly the trial that failed: ``lifeline bench fuzz --seed SEED --trials 1
--max-world MAX_WORLD --draws DRAWS`` (with ``--model MODEL`` when it is not the reference model; tests/fuzz/test_fuzz.py
runs each as its own test id). Add a seed when a
trial fails (in CI or by hand), with what it found; never remove one — a fixed bug stays fixed.
"""

from __future__ import annotations

from typing import NamedTuple


class Regression(NamedTuple):
    seed: int
    max_world: int
    found: str
    """What the trial found when it was added (the bug, or the finding's first reason)."""
    fixed: str = ""
    """What fixed it, and the unit or e2e test that pins the fix (empty while open)."""
    long: bool = False
    """The trial waits out ``startupGraceSeconds`` by design (a hang during a recovery: ~150 s each):
    run with every other seed when ``LIFELINE_FUZZ_TRIALS`` is set, left out of the default CI run,
    whose budget (issue 23) has room for the others only; its fix is pinned by the unit test named."""
    model: str = "gpt-moe"
    """Whose draws (``lifeline bench fuzz --model``): ``gpt-moe`` or ``pipelining-moe``."""
    draws: int = 1
    """The draw version the seed failed under (``lifeline bench fuzz --draws``): 1 for every seed found
    before 2026-11-29 (version 2 added ``compute_dtype``); a new seed names the version it failed with."""


REGRESSIONS: list[Regression] = [
    Regression(143203680, 4, "a hang during the recovery of a hang (tensor 2, 1F1B, sparse window 2, Redis restart "
               "and MinIO outage before): both restarted trainers are declared silent only after "
               "startupGraceSeconds (121 s) and their pods replaced, so the L0 copies go with the sidecars and the "
               "job rolls back to L2's step 6 (time lost 129.6 s > bound 115 s); the engine should restart a "
               "silent trainer whose sidecar still heartbeats in place (found 2026-11-27)",
               fixed="a frozen trainer whose sidecar heartbeats is a HANG of its rank, restarted in its pod "
               "(tests/control/test_control_hang.py::test_a_frozen_trainer_whose_sidecar_heartbeats_is_restarted_"
               "in_its_pod_where_the_runner_can); the bound of a hang during a recovery includes the grace",
               long=True),
    Regression(3, 4, "tensor 2 x expert 2, keep 1: a hang of rank 0 during the ReplacePods answering a sidecar "
               "kill is not found by the hang timeout; after startupGraceSeconds the engine blames the "
               "replacement ('trainer silent 121s since the recovery began'), replaces it again and rolls back "
               "to the initial state: time lost 158.5 s > bound 125 s (found 2026-11-27)",
               fixed="as 143203680", long=True),
    Regression(9, 4, "pipeline 3, sparse window 3, localized replay: an L2 flip's Rollback to step 4 fails for "
               "rank 0 (the flipped copy), the LocalizedReplay planned next for its stage replays to the old "
               "step 6 while the survivors had restored step 4 ('localized replay to step 6, but this surviving "
               "rank is at step 4'): a third recovery without a new fault (found 2026-11-27)",
               fixed="the engine plans from the step the ranks' states are at (Progress.state_step; "
               "tests/control/test_control_progress.py)"),
    Regression(12, 4, "pipeline 3: a hang during the Rollback answering an L2 flip is found after 121 s, the "
                "replacements blamed ('trainer silent 121s since the recovery began'): time lost 141.8 s > "
                "bound 120 s (found 2026-11-27)", fixed="as 143203680", long=True),
    Regression(503, 4, "pipeline 2: after an L1 flip, a Redis restart and a node loss, a Rollback to the initial "
               "state; the in-process survivor sat in a second round of new_group calls that the restarted "
               "rank never made, until the engine saw a hang: extra recoveries without a new fault (found "
               "2026-11-27)", fixed="the initial state is loaded into the connected trainer, no second connect "
               "(tests/launch/test_launch_recovery.py::test_a_crash_before_any_checkpoint_restarts_everyone_"
               "from_the_initial_state_in_their_processes)"),
    Regression(505, 4, "expert 4, keep 1: a sidecar kill at step 2, a Rollback to the initial state, then the "
               "same hang as 503 (found 2026-11-27)", fixed="as 503"),
    Regression(507, 4, "expert 4: a hang, a trainer kill during its recovery, a MinIO outage and an L2 flip; "
               "the flip's Rollback to the initial state hung as 503 (found 2026-11-27)", fixed="as 503"),
    Regression(606, 4, "data 2 x expert 2: a trainer kill during the Rollback answering a sidecar kill took down "
               "generation 1's rendezvous store (rank 0 hosts it); rank 3 exited 2 ('rendezvous store of "
               "generation 1 failed'), a second failure answered by a third plan (found 2026-11-27)",
               fixed="a rank whose generation's store died waits for the newer plan "
               "(tests/runtime/test_rendezvous_store.py)"),
    Regression(193682496, 4, "pipeline 3, localized replay, persist.every 2: a sidecar kill, then a node loss "
               "during its recovery; the second plan restored rank 0 at step 5 from the L1 copy held by rank 1's "
               "sidecar, which had died with the first fault (its replacement was still starting): the restore "
               "failed (exit 2) and a Rollback followed without a new fault (found 2026-11-27)",
               fixed="publishing a plan forgets the memory copies held by the ranks whose memory it declares lost "
               "(Catalog.put_plan, RecoveryPlan.memory_lost_ranks; tests/control/test_lost_copies.py)"),
    Regression(804, 4, "data 2, keep 2: a node loss, an L0 flip of rank 1 (both its slots, steps 1 and 2) and a hang "
               "during the recovery: the restore found step 2's copy corrupt, the next plan named step 1's, also "
               "corrupt, and a third plan rolled back to the initial state: one extra recovery per corrupt slot "
               "(found 2026-11-27 by `bench fuzz --seed 800 --trials 8`)",
               fixed="a sidecar that finds a corrupt copy verifies the rank's other copies it holds and drops "
               "the corrupt ones before it answers (Restorer._scrub; tests/sidecar/test_sidecar.py::"
               "test_a_corrupt_l0_copy_makes_the_sidecar_scrub_and_drop_every_corrupt_copy_of_that_rank)",
               long=True),
    Regression(222597789, 4, "data 3, 1F1B: a sidecar kill of rank 2 at step 3 (before its copy was replicated: a "
               "Rollback to the initial state), then an L1 flip of rank 2 at step 4: no copy of rank 2 existed to "
               "corrupt, and the verdict failed the trial ('corrupted no copy'); found 2026-11-27 in a two-worker "
               "CI run", fixed="a flip that finds no copy while the catalog records none of the rank at its tier "
               "is moot (FiredFault.moot): its kill counts, its corruption check does not; a flip that misses a "
               "recorded copy still fails (tests/launch/test_chaos_units.py)"),
    Regression(12836737, 4, "pipeline 2, persist.every 6: an L2 flip of rank 1's step 6, found corrupt (a Rollback to "
               "the initial state), step 6 persisted again, and flipped again by a second L2 flip: its detection "
               "was matched to the first flip's earlier report, so the last Rollback counted as answering no "
               "fault; found 2026-11-27 by a commit trial of 0c3df83", fixed="a flip's detection is the first report "
               "after it fired (_fuzz_check._detected_at; tests/fuzz/test_fuzz_units.py::"
               "test_the_same_copy_flipped_twice_calls_for_one_more_plan_each_time)"),
    Regression(3027, 4, "a Redis restart and an L0 flip at the same step (seed 3027 of the 2026-11-28 campaign "
               "`--seed 3000 --trials 100 --max-world 4`): the flip fired in the supervisor round that had just "
               "killed Redis, read the catalog while Redis was down ('corrupted no copy: CatalogError ... "
               "Connection refused'); its wait then held up the round whose watch restarts Redis",
               fixed="a flip waits for the catalog and the rank's registration, running the round's service "
               "watch itself (Faults._await_catalog; tests/launch/test_chaos_units.py::"
               "test_a_flip_after_a_redis_restart_waits_for_the_catalog_and_restarts_redis_itself)"),
    Regression(3077, 4, "a MinIO outage and an L2 flip at the same step (campaign of 2026-11-28): the flip listed the "
               "storage in the round of the outage ('corrupted no copy: StorageError: list failed ... Connection "
               "refused')", fixed="an L2 flip waits out the run's own MinIO outage, ticking the round's service "
               "watch (Faults._await_minio; tests/launch/test_chaos_units.py::"
               "test_an_l2_flip_waits_out_the_minio_outage_of_its_round)"),
    Regression(3074, 4, "data 2 x expert 2, persist.every 6: a MinIO outage at step 6 held rank 0's upload of step 6 "
               "until its node was lost at step 7, so no step was committed before 12; the L2 flip at step 8 found "
               "none and failed the trial ('corrupted no copy: no step committed to L2'; campaign of 2026-11-28)",
               fixed="an L2 flip that finds no committed step is moot when the catalog records no L2 copy of the "
               "rank, as L0/L1 flips are (Faults._moot; tests/launch/test_chaos_units.py::"
               "test_verdict_names_each_failed_check, a moot flip passes)"),
    Regression(11, 3, "pipelining-moe, 3 stages, 1F1B, 6 micro-batches: after two L2 flips a Rollback to the initial "
               "state failed verification in a process started later ('differs from the copy saved at step 1'): "
               "the example never seeded Python's random, whose state is part of every checkpoint; a third plan "
               "without a new fault (found 2026-11-28, campaign `--model pipelining-moe`)",
               fixed="the example seeds random from the job's seed (tests/fuzz/test_fuzz_pipelining_units.py::"
               "test_fuzz_seed_11_a_new_process_starts_from_the_same_initial_state)", model="pipelining-moe"),
    Regression(23, 3, "pipelining-moe, 3 stages, localized replay: a hang of a trainer restarted by the recovery of "
               "a hang, frozen before it spoke: its old incarnation's plan report hid the new one's silence and "
               "the survivors beat at the rendezvous for 180 s (time lost 190.5 s > bound 155 s; found 2026-11-28)",
               fixed="a rank whose running trainer started after its last word is starting (engine._unspoken; "
               "tests/control/test_control_recovery_beat.py::test_a_trainer_restarted_after_its_old_incarnation_"
               "spoke_since_the_plan_is_starting_not_unseen)", long=True, model="pipelining-moe"),
    Regression(2, 3, "pipelining-moe, 2 stages: an L2 flip took both nodes down and Redis restarted empty in the "
               "same round; with the trainers' progress gone the engine capped every copy at step 0 and rolled "
               "back to the initial state although L2 held step 2, and the complete step read 1 after 4 "
               "(found 2026-11-28, campaign `--model pipelining-moe`)",
               fixed="the engine falls back on the state step the runner last saw (Record.state_step) and the "
               "launcher writes back the latest complete step (Catalog.restore_complete_step; "
               "tests/control/test_lost_progress.py)", model="pipelining-moe"),
    Regression(3085, 4, "data 4, every 1, keep 1: a hang's RestartInPlace named the L0 copies of step 10, and saves of "
               "step 11 sealed after the plan's catalog read evicted them ('no verified copy of step 10 rank 2'; a "
               "second recovery followed; campaign of 2026-11-28)",
               fixed="lifeline run and the operator spare the step of every plan that reads memory before publishing "
               "it (RecoveryPlan.reads_memory; tests/sidecar/test_spare.py::"
               "test_lifeline_run_spares_the_step_of_a_recovery_plan_that_reads_memory)"),
    Regression(3089, 4, "pipeline 2, localized replay: rank 0's node was lost (its log of steps 6..9 then lived only "
               "as a replica in rank 1's sidecar), then rank 1's sidecar was killed and stage 1's replay from L2 step 6 "
               "was planned from that log ('upstream log ... of rank 0 is not held anywhere'; a Rollback followed; "
               "campaign of 2026-11-28)",
               fixed="a plan applies the loss of the logs its failures' sidecars held (UpstreamLog.after_losing) and "
               "the catalog records it with the plan (logs:gone, logs:floor; tests/control/test_lost_logs.py)"),
    Regression(3220, 4, "data 3: a node loss of rank 2 (the only holder of rank 1's L1 copy) and an L1 flip of rank 1 "
               "at the same step: the flip found no copy, the catalog still recorded rank 2's, so the harness "
               "counted a failed corruption ('corrupted no copy'), not a moot flip; the job itself rolled back to "
               "L2, bit-identical (a harness defect; campaign of 2026-11-29)",
               fixed="a flip is moot when no live sidecar holds a recorded copy (launch.faults.held_copies; "
               "tests/launch/test_chaos_units.py::test_a_flip_finds_copies_only_in_live_sidecars)"),
    Regression(5098, 4, "pipeline 2 x expert 2, bf16 compute, keep 1, a MinIO outage at step 7: step 8 was superseded "
               "by step 10 while rank 0's persister backed off, and both the offer and the persister unpinned it; its "
               "pin count went to -1, the store never evicted it, and the trainer waited for an arena slot at step 12 "
               "until the job was declared hung (then the same after the restart, the killed trainer's connection "
               "still waiting with its restore pins; found 2026-11-29, the suspect of seed 3040)",
               fixed="one owner per persistence pin (PersistDue.take/retry), an unpin never below zero, and a wait for "
               "a slot ends when its trainer hangs up (tests/sidecar/test_pins.py)", draws=2),
    Regression(3314, 4, "the run's summary raised ConfigError ('steps, stall and recovery time must be >= 0'): its "
               "recoveries overlapped and their seconds summed past the wall time, and the fuzz campaign's process "
               "ended with the trial (found 2026-11-29)",
               fixed="the summary's ETTR terms are clamped to the wall time (launch.summary.ettr_terms; "
               "tests/launch/test_chaos_units.py::test_the_run_summary_accounts_overlapping_recoveries_within_the_"
               "wall_time)", draws=2),
    Regression(3386, 4, "pipeline 2 x expert 2: a trainer kill of rank 0 and a node loss of rank 1 during its Rollback; "
               "rank 0's trainer, restarted for generation 1, was still importing when generation 2 was published, "
               "was killed as stuck 1.5 s later just after it began hosting generation 2's rendezvous store, and "
               "ranks 2 and 3 failed on it ('its rendezvous store failed: ... Connection reset by peer'): a third "
               "recovery without a fault (campaign of 2026-11-29)",
               fixed="a trainer that has not reported since it started is starting, not stuck (launch._records."
               "stuck_ranks; tests/launch/test_chaos_units.py::test_a_trainer_that_has_not_reported_since_it_"
               "started_is_starting_not_stuck)", draws=2),
    Regression(3405, 4, "data 3, bf16 compute, sparse window 4: a hang at step 3 made the job roll back and train step 3 "
               "again, which was saved again, with the same bytes, into another arena slot; the L0 flip of rank 1 at "
               "step 4 flipped only the first slot holding step 3, the restart restored the intact newer copy, and "
               "the harness took that read for a corrupted copy restored without a report (campaign of 2026-11-29)",
               fixed="an L0 flip reaches every slot that holds the step (launch.find_slots; tests/launch/"
               "test_chaos_units.py::test_an_l0_flip_reaches_every_slot_that_holds_the_step)", draws=2),
]
