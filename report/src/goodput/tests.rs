use super::account::*;
use super::steps::*;
use super::timeline::*;
use super::*;
use proptest::prelude::*;

fn attempt(
    attempt: u32,
    start: f64,
    end: f64,
    failed_at: Option<f64>,
    steps: &[(f64, u64)],
) -> AttemptSpan {
    AttemptSpan {
        attempt,
        start,
        end,
        failed_at,
        steps: steps.to_vec(),
        ..AttemptSpan::default()
    }
}

fn sums_to_wall(g: &Goodput) {
    assert!((g.breakdown.total() - g.wall_s).abs() < 1e-6, "{g:?}");
    for c in Category::ALL {
        assert!(g.breakdown.get(c) >= 0.0, "{c:?} {g:?}");
    }
    let per: f64 = g.allocations.iter().map(|a| a.breakdown.total()).sum();
    assert!((per - g.wall_s).abs() < 1e-6, "{g:?}");
}

#[test]
fn a_crash_a_restart_and_a_requeue_after_a_time_limit_stop_are_each_counted() {
    // Allocation 1 (0..100): start-up 0..5; attempt 0 steps 5..30 reaching step 25; crash at
    // 32; attempt 1 from 40 resumes at step 20, runs to step 60 at 80; the time limit's stop
    // at 80 (window 20, so the allocation would end at 100) ends the job at 90.
    // Allocation 2 (130..150) resumes at 60.
    let t = Timeline {
        allocations: vec![
            AllocationSpan {
                number: 1,
                start: 0.0,
                end: 90.0,
                scheduled_end: Some(100.0),
                final_step: Some(60),
                attempts: vec![
                    attempt(0, 2.0, 34.0, Some(32.0), &[(5.0, 0), (30.0, 25)]),
                    attempt(1, 40.0, 88.0, None, &[(42.0, 20), (80.0, 60)]),
                ],
                ..AllocationSpan::default()
            },
            AllocationSpan {
                number: 2,
                start: 130.0,
                end: 150.0,
                scheduled_end: None,
                final_step: Some(70),
                attempts: vec![attempt(0, 131.0, 149.0, None, &[(133.0, 60), (143.0, 70)])],
                ..AllocationSpan::default()
            },
        ],
    };
    let g = compute(&t);
    sums_to_wall(&g);
    assert_eq!(g.wall_s, 150.0);
    let b = &g.breakdown;
    // Start-up: 0..5, 40..42, 130..133.
    assert!((b.get(Category::StartUp) - 10.0).abs() < 1e-9, "{b:?}");
    // Steps 20..25 of attempt 0 (25..30) and its unrecorded tail 30..32 were redone.
    assert!((b.get(Category::LostProgress) - 7.0).abs() < 1e-9, "{b:?}");
    // From the crash at 32 to attempt 1's start at 40.
    assert!(
        (b.get(Category::FailureHandling) - 8.0).abs() < 1e-9,
        "{b:?}"
    );
    // 5..25, 42..80, 133..143.
    assert!((b.get(Category::Goodput) - 68.0).abs() < 1e-9, "{b:?}");
    // From the stopped attempt's end at 88 to the allocation's would-be end at 100, then the
    // queue 100..130.
    assert!(
        (b.get(Category::StopLeadUnused) - 12.0).abs() < 1e-9,
        "{b:?}"
    );
    assert!((b.get(Category::QueueWait) - 30.0).abs() < 1e-9, "{b:?}");
    assert_eq!(b.get(Category::Checkpoint), 0.0);
    // 80..88 (saving at the stop step, exiting), 143..150.
    assert!((b.get(Category::Other) - 15.0).abs() < 1e-9, "{b:?}");
    assert_eq!(g.allocations[1].breakdown.get(Category::QueueWait), 30.0);
    // Step times: 1.0 (25 steps), 0.95 (40), 1.0 (10).
    let st = &g.steps;
    assert_eq!(st.samples.len(), 3);
    assert!(!st.sub_second);
    assert!((st.ideal_step_time_s.unwrap() - 1.0).abs() < 1e-9);
}

#[test]
fn saves_are_checkpoint_time_wherever_they_fall_and_ranks_saving_together_count_once() {
    // Steps 10..50 over 0..40 at one step a second; two ranks save 20..23 and 21..24 (one
    // save, 20..24), and the save at the stop step runs 42..45 after the last record (other
    // before). A save reported as longer than its attempt counts only inside it.
    let mut a = attempt(0, 0.0, 46.0, None, &[(0.0, 10), (40.0, 50)]);
    a.saves = vec![(20.0, 23.0), (21.0, 24.0), (42.0, 45.0), (-30.0, 0.5)];
    let t = Timeline {
        allocations: vec![AllocationSpan {
            number: 1,
            start: 0.0,
            end: 50.0,
            attempts: vec![a],
            ..AllocationSpan::default()
        }],
    };
    let g = compute(&t);
    sums_to_wall(&g);
    let b = &g.breakdown;
    assert!((b.get(Category::Checkpoint) - 7.5).abs() < 1e-9, "{b:?}");
    // 0.5..20 and 24..40.
    assert!((b.get(Category::Goodput) - 35.5).abs() < 1e-9, "{b:?}");
    // 40..42, 45..50.
    assert!((b.get(Category::Other) - 7.0).abs() < 1e-9, "{b:?}");
    assert!(
        !g.notes.iter().any(|n| n == CHECKPOINT_NOTE),
        "{:?}",
        g.notes
    );
    // The saves of an attempt that is redone are checkpoint time too; a capped rank is said.
    let mut t2 = t.clone();
    t2.allocations[0].attempts[0].saves_incomplete = true;
    let g2 = compute(&t2);
    assert!(g2.notes.iter().any(|n| n == CHECKPOINT_CAPPED_NOTE));
    assert_eq!(g2.breakdown, g.breakdown);
}

#[test]
fn the_queue_wait_begins_at_the_submission_and_ends_at_slurms_start() {
    // Submitted at 0, started by Slurm at 30, the agent at 35, ranks stepping from 40 to 60;
    // requeued at 60, Slurm starts it again at 80 and the agent at 82.
    let t = Timeline {
        allocations: vec![
            AllocationSpan {
                number: 1,
                start: 35.0,
                end: 60.0,
                submit_time: Some(0.0),
                slurm_start: Some(30.0),
                attempts: vec![attempt(0, 36.0, 60.0, None, &[(40.0, 0), (60.0, 20)])],
                ..AllocationSpan::default()
            },
            AllocationSpan {
                number: 2,
                start: 82.0,
                end: 90.0,
                submit_time: Some(0.0),
                slurm_start: Some(80.0),
                attempts: vec![attempt(0, 83.0, 90.0, None, &[(84.0, 20), (90.0, 26)])],
                ..AllocationSpan::default()
            },
        ],
    };
    let g = compute(&t);
    sums_to_wall(&g);
    assert_eq!((g.start, g.wall_s), (0.0, 90.0));
    let b = &g.breakdown;
    assert!((b.get(Category::QueueWait) - 50.0).abs() < 1e-9, "{b:?}");
    // 30..40 and 80..84.
    assert!((b.get(Category::StartUp) - 14.0).abs() < 1e-9, "{b:?}");
    assert_eq!(g.allocations[0].breakdown.get(Category::QueueWait), 30.0);
    // Slurm's times after the agent's start (another clock) move nothing.
    let mut t2 = t.clone();
    t2.allocations[0].submit_time = Some(50.0);
    t2.allocations[0].slurm_start = Some(51.0);
    let g2 = compute(&t2);
    sums_to_wall(&g2);
    assert_eq!(g2.start, 35.0);
    assert!((g2.breakdown.get(Category::QueueWait) - 20.0).abs() < 1e-9);
}

#[test]
fn a_hang_counts_its_detection_wait_as_failure_handling() {
    let t = Timeline {
        allocations: vec![AllocationSpan {
            number: 1,
            start: 0.0,
            end: 50.0,
            attempts: vec![
                attempt(0, 1.0, 22.0, Some(12.0), &[(2.0, 0), (12.0, 10)]),
                attempt(1, 23.0, 49.0, None, &[(24.0, 10), (44.0, 30)]),
            ],
            ..AllocationSpan::default()
        }],
    };
    let g = compute(&t);
    sums_to_wall(&g);
    assert!((g.breakdown.get(Category::FailureHandling) - 11.0).abs() < 1e-9);
    assert_eq!(g.breakdown.get(Category::LostProgress), 0.0);
    // 44..50: after the last record, with no final step to reach.
    assert!((g.breakdown.get(Category::Other) - 6.0).abs() < 1e-9);
}

#[test]
fn the_ideal_step_time_leaves_out_slow_outliers_and_sub_second_steps() {
    let v = [
        (2.0, 1.0),
        (2.1, 1.0),
        (1.9, 1.0),
        (2.0, 1.0),
        (30.0, 1.0),
        (0.5, 1.0),
    ];
    let i = ideal_step_time(&v).unwrap();
    assert!((i - 2.0).abs() < 1e-9, "{i}");
    assert_eq!(ideal_step_time(&[(0.2, 5.0)]), None);
    assert_eq!(weighted_median(&[(1.0, 1.0), (3.0, 1.0)]), Some(2.0));
    assert_eq!(weighted_median(&[(1.0, 1.0), (3.0, 5.0)]), Some(3.0));
}

#[test]
fn a_history_becomes_job_wide_attempts_with_their_failure_times() {
    use crate::records::{parse_jsonl, RecordFile};
    let log = concat!(
        r#"{"event":"cycle_start","cycle":0,"host":"a","node_rank":0,"ts":100.0}"#,
        "\n",
        r#"{"event":"steps","cycle":0,"step":5,"min_step":4,"host":"a","node_rank":0,"ts":101.0}"#,
        "\n",
        r#"{"event":"hang","cycle":0,"rank":1,"timeout":"heartbeat","silent_ms":3000,"host":"a","node_rank":0,"ts":110.0}"#,
        "\n",
        r#"{"event":"cycle_ended","cycle":0,"end":"failed","node":0,"reason":"hung","host":"a","node_rank":0,"ts":110.5}"#,
        "\n",
        r#"{"event":"cycle_start","cycle":1,"host":"a","node_rank":0,"ts":111.0}"#,
        "\n",
        r#"{"event":"stop_triggered","cycle":1,"trigger":"time-limit","window_ms":4000,"host":"a","node_rank":0,"ts":115.0}"#,
        "\n",
        r#"{"event":"stop_agreed","cycle":1,"step":9,"trigger":"time-limit","host":"a","node_rank":0,"ts":115.1}"#,
        "\n",
        r#"{"event":"section","cycle":1,"local_rank":0,"rank":0,"name":"checkpointing","duration_ms":500,"host":"a","node_rank":0,"ts":115.6}"#,
        "\n",
        r#"{"event":"cycle_ended","cycle":1,"end":"done","host":"a","node_rank":0,"ts":116.0}"#,
        "\n",
        r#"{"event":"result","outcome":"stopped","exit_code":75,"host":"a","node_rank":0,"ts":116.0}"#,
        "\n",
    );
    let file = RecordFile {
        path: "r/events.jsonl".into(),
        records: parse_jsonl(log, std::path::Path::new("r")).0,
    };
    let h = crate::history::build("d".into(), &[file], &[]);
    let t = timeline(&h);
    let a = &t.allocations[0];
    assert_eq!((a.start, a.end), (100.0, 116.0));
    assert_eq!(a.scheduled_end, Some(119.0));
    assert_eq!(a.final_step, Some(9));
    assert_eq!(a.attempts.len(), 2);
    assert_eq!(a.attempts[0].failed_at, Some(107.0));
    assert_eq!(a.attempts[0].steps, vec![(101.0, 4)]);
    assert_eq!(a.attempts[1].failed_at, None);
    assert_eq!(a.attempts[1].saves, vec![(115.1, 115.6)]);
    assert!(!a.attempts[1].saves_incomplete);
    let g = compute(&t);
    sums_to_wall(&g);
    // 107..111: the hang's silence, its detection and the restart.
    assert!(
        (g.breakdown.get(Category::FailureHandling) - 4.0).abs() < 1e-9,
        "{g:?}"
    );
    // 116..119 lies past the wall time's end (the job's last record): not counted.
    assert_eq!(g.wall_s, 16.0);
    assert!((g.breakdown.get(Category::Checkpoint) - 0.5).abs() < 1e-9);
}

#[test]
fn no_allocation_is_no_wall_time() {
    let g = compute(&Timeline::default());
    assert_eq!(g.wall_s, 0.0);
    assert!(render_table(&g).contains("goodput 0.0%"));
}

fn arb_attempt() -> impl Strategy<Value = AttemptSpan> {
    (
        0u32..4,
        -10.0f64..200.0,
        0.0f64..100.0,
        proptest::option::of(-10.0f64..300.0),
        proptest::collection::vec((-10.0f64..300.0, 0u64..100), 0..6),
        proptest::collection::vec((-10.0f64..300.0, -5.0f64..50.0), 0..4),
    )
        .prop_map(|(attempt, start, len, failed_at, mut steps, saves)| {
            steps.sort_by(|a, b| a.0.total_cmp(&b.0));
            AttemptSpan {
                attempt,
                start,
                end: start + len,
                failed_at,
                steps,
                saves: saves.into_iter().map(|(s, d)| (s, s + d)).collect(),
                saves_incomplete: false,
                step_s: None,
                generations: Vec::new(),
            }
        })
}

fn arb_allocation() -> impl Strategy<Value = AllocationSpan> {
    (
        -20.0f64..400.0,
        -5.0f64..200.0,
        proptest::option::of(-20.0f64..600.0),
        proptest::option::of(0u64..200),
        proptest::collection::vec(arb_attempt(), 0..4),
        proptest::option::of((-100.0f64..400.0, -100.0f64..400.0)),
    )
        .prop_map(
            |(start, len, scheduled_end, final_step, attempts, slurm)| AllocationSpan {
                number: 1,
                start,
                end: start + len,
                scheduled_end,
                final_step,
                attempts,
                submit_time: slurm.map(|s| s.0),
                slurm_start: slurm.map(|s| s.1),
            },
        )
}

proptest! {
    // Whatever the records say, even out of order or overlapping: the categories add up to
    // the wall time and none is negative.
    #[test]
    fn the_categories_always_add_up_to_the_wall_time(
        mut allocations in proptest::collection::vec(arb_allocation(), 1..4)
    ) {
        allocations.sort_by(|x, y| x.start.total_cmp(&y.start));
        let g = compute(&Timeline { allocations });
        prop_assert!(g.wall_s >= 0.0);
        prop_assert!((g.breakdown.total() - g.wall_s).abs() < 1e-6 * (1.0 + g.wall_s));
        for c in Category::ALL {
            prop_assert!(g.breakdown.get(c) >= 0.0);
        }
        let per: f64 = g.allocations.iter().map(|a| a.breakdown.total()).sum();
        prop_assert!((per - g.wall_s).abs() < 1e-6 * (1.0 + g.wall_s));
        prop_assert!(g.goodput_fraction >= 0.0 && g.goodput_fraction <= 1.0 + 1e-9);
    }
}

fn history_of(lines: &[&str]) -> crate::history::History {
    use crate::records::{parse_jsonl, RecordFile};
    let log = lines.join("\n") + "\n";
    let file = RecordFile {
        path: "r/events.jsonl".into(),
        records: parse_jsonl(&log, std::path::Path::new("r")).0,
    };
    crate::history::build("d".into(), &[file], &[])
}

#[test]
fn a_steps_record_from_the_back_off_before_an_attempt_is_not_its_step_time() {
    // An older vigil, during the 4 s back-off before attempt 1, wrote attempt 0's last step (90)
    // under attempt 1's number. Attempt 1 resumes from step 50 (a checkpoint) and is stopped.
    let h = history_of(&[
        r#"{"event":"cycle_start","cycle":0,"host":"a","node_rank":0,"ts":100.0}"#,
        r#"{"event":"steps","cycle":0,"step":0,"min_step":0,"host":"a","node_rank":0,"ts":102.0}"#,
        r#"{"event":"steps","cycle":0,"step":80,"min_step":80,"host":"a","node_rank":0,"ts":110.0}"#,
        r#"{"event":"rank_exited","cycle":0,"local_rank":1,"rank":1,"pid":7,"expected":false,"how":"signal","signal":9,"host":"a","node_rank":0,"ts":111.0}"#,
        r#"{"event":"cycle_ended","cycle":0,"end":"failed","node":0,"reason":"rank 1 died","host":"a","node_rank":0,"ts":111.0}"#,
        r#"{"event":"steps","cycle":1,"step":90,"min_step":90,"host":"a","node_rank":0,"ts":112.0}"#,
        r#"{"event":"cycle_start","cycle":1,"host":"a","node_rank":0,"ts":115.0}"#,
        r#"{"event":"steps","cycle":1,"step":51,"min_step":51,"host":"a","node_rank":0,"ts":118.0}"#,
        r#"{"event":"steps","cycle":1,"step":100,"min_step":100,"host":"a","node_rank":0,"ts":123.0}"#,
        r#"{"event":"cycle_ended","cycle":1,"end":"done","host":"a","node_rank":0,"ts":124.0}"#,
        r#"{"event":"result","outcome":"succeeded","exit_code":0,"host":"a","node_rank":0,"ts":124.0}"#,
    ]);
    let t = timeline(&h);
    let a = &t.allocations[0];
    assert_eq!(a.attempts[1].steps, vec![(118.0, 51), (123.0, 100)]);
    let g = compute(&t);
    sums_to_wall(&g);
    // Kept: attempt 0 from 102 up to step 51 (at 107.1), attempt 1 from 118 to 123.
    let kept = (102.0 + 51.0 / 80.0 * 8.0 - 102.0) + 5.0;
    assert!(
        (g.breakdown.get(Category::Goodput) - kept).abs() < 1e-6,
        "{g:?}"
    );
    // Attempt 1's start-up (115..118) is start-up, not step time.
    assert!(
        (g.breakdown.get(Category::StartUp) - 5.0).abs() < 1e-6,
        "{g:?}"
    );
}

#[test]
fn a_short_attempt_is_counted_from_its_first_and_last_steps_and_the_ranks_step_time() {
    // 6 s of an allocation: the first record at once, the last one when the attempt ended
    // (stamped when its step was reached), and the ranks' own step time.
    let h = history_of(&[
        r#"{"event":"cycle_start","cycle":0,"host":"a","node_rank":0,"ts":100.0}"#,
        r#"{"event":"steps","cycle":0,"step":1,"min_step":1,"step_s":0.05,"host":"a","node_rank":0,"ts":101.0}"#,
        r#"{"event":"steps","cycle":0,"step":81,"min_step":81,"step_s":0.05,"host":"a","node_rank":0,"ts":105.0}"#,
        r#"{"event":"cycle_ended","cycle":0,"end":"done","host":"a","node_rank":0,"ts":105.5}"#,
        r#"{"event":"result","outcome":"succeeded","exit_code":0,"host":"a","node_rank":0,"ts":106.0}"#,
    ]);
    let g = of_history(&h);
    sums_to_wall(&g);
    assert!(
        (g.breakdown.get(Category::Goodput) - 4.0).abs() < 1e-6,
        "{g:?}"
    );
    // One record only (a job shorter than the first tick after its first step): the step time
    // is the ranks' own.
    let h = history_of(&[
        r#"{"event":"cycle_start","cycle":0,"host":"a","node_rank":0,"ts":100.0}"#,
        r#"{"event":"steps","cycle":0,"step":1,"min_step":1,"step_s":0.05,"host":"a","node_rank":0,"ts":101.0}"#,
        r#"{"event":"cycle_ended","cycle":0,"end":"done","host":"a","node_rank":0,"ts":103.0}"#,
        r#"{"event":"result","outcome":"succeeded","exit_code":0,"host":"a","node_rank":0,"ts":103.0}"#,
    ]);
    let mut t = timeline(&h);
    t.allocations[0].final_step = Some(21);
    let g = compute(&t);
    assert!(
        (g.breakdown.get(Category::Goodput) - 1.0).abs() < 1e-6,
        "{g:?}"
    );
    assert_eq!(g.steps.ideal_step_time_s, Some(0.05));
}

#[test]
fn a_running_jobs_wall_time_runs_to_now() {
    // A second into a job: two records 30 µs apart (field finding 39 read 0.00003 s).
    let lines = [
        r#"{"event":"cycle_start","cycle":0,"host":"a","node_rank":0,"ts":100.0}"#,
        r#"{"event":"rank_started","cycle":0,"local_rank":0,"rank":0,"pid":7,"host":"a","node_rank":0,"ts":100.00003}"#,
    ];
    let h = history_of(&lines);
    assert!((of_history_at(&h, 101.0).wall_s - 1.0).abs() < 1e-9);
    let g = of_history_at(&h, 101.0);
    sums_to_wall(&g);
    // Read afterwards (no `now`), or once the run has its result, the records end it.
    assert!(of_history(&h).wall_s < 1e-3);
    let mut ended = lines.to_vec();
    ended.push(r#"{"event":"result","outcome":"succeeded","exit_code":0,"host":"a","node_rank":0,"ts":100.5}"#);
    assert!((of_history_at(&history_of(&ended), 200.0).wall_s - 0.5).abs() < 1e-9);
}

fn history_of_nodes(nodes: &[&[&str]]) -> crate::history::History {
    use crate::records::{parse_jsonl, RecordFile};
    let files: Vec<RecordFile> = nodes
        .iter()
        .enumerate()
        .map(|(i, lines)| RecordFile {
            path: format!("n{i}/events.jsonl").into(),
            records: parse_jsonl(&(lines.join("\n") + "\n"), std::path::Path::new("r")).0,
        })
        .collect();
    crate::history::build("d".into(), &files, &[])
}

/// 2 nodes (ranks 0-1 on node 0, 2-3 on node 1): rank 2 is killed at 120 and replaced in
/// process (generation 1: node 0's ranks step again at 120.5, node 1's at 120.7); rank 1 is
/// killed at 140 and generation 2 never trains (a survivor overdue): the whole job restarts
/// and attempt 1 goes on from step 101, while attempt 0 had reached 130.
fn two_generations() -> crate::history::History {
    let n0: &[&str] = &[
        r#"{"event":"cycle_start","cycle":0,"host":"a","node_rank":0,"ts":100.0}"#,
        r#"{"event":"steps","cycle":0,"step":0,"min_step":0,"host":"a","node_rank":0,"ts":101.0}"#,
        r#"{"event":"generation","cycle":0,"generation":1,"ranks":[2],"step":40,"host":"a","node_rank":0,"ts":120.2}"#,
        r#"{"event":"generation_stepping","cycle":0,"generation":1,"seconds":0.3,"host":"a","node_rank":0,"ts":120.5}"#,
        r#"{"event":"steps","cycle":0,"step":45,"min_step":45,"host":"a","node_rank":0,"ts":121.0}"#,
        r#"{"event":"steps","cycle":0,"step":130,"min_step":130,"host":"a","node_rank":0,"ts":139.0}"#,
        r#"{"event":"rank_exited","cycle":0,"local_rank":1,"rank":1,"pid":7,"expected":false,"how":"signal","signal":9,"host":"a","node_rank":0,"ts":140.0}"#,
        r#"{"event":"generation","cycle":0,"generation":2,"ranks":[1],"step":130,"host":"a","node_rank":0,"ts":140.1}"#,
        r#"{"event":"in_process_declined","cycle":0,"reason":"rank 0 did not come back","host":"a","node_rank":0,"ts":150.0}"#,
        r#"{"event":"cycle_ended","cycle":0,"end":"failed","node":0,"reason":"rank 0 did not come back","host":"a","node_rank":0,"ts":151.0}"#,
        r#"{"event":"cycle_start","cycle":1,"host":"a","node_rank":0,"ts":155.0}"#,
        r#"{"event":"steps","cycle":1,"step":101,"min_step":101,"host":"a","node_rank":0,"ts":158.0}"#,
        r#"{"event":"steps","cycle":1,"step":200,"min_step":200,"host":"a","node_rank":0,"ts":168.0}"#,
        r#"{"event":"cycle_ended","cycle":1,"end":"done","host":"a","node_rank":0,"ts":169.0}"#,
        r#"{"event":"result","outcome":"succeeded","exit_code":0,"host":"a","node_rank":0,"ts":169.0}"#,
    ];
    let n1: &[&str] = &[
        r#"{"event":"cycle_start","cycle":0,"host":"b","node_rank":1,"ts":100.0}"#,
        r#"{"event":"rank_exited","cycle":0,"local_rank":0,"rank":2,"pid":8,"expected":false,"how":"signal","signal":9,"host":"b","node_rank":1,"ts":120.0}"#,
        r#"{"event":"generation","cycle":0,"generation":1,"ranks":[2],"step":40,"host":"b","node_rank":1,"ts":120.1}"#,
        r#"{"event":"generation_recovered","cycle":0,"generation":1,"seconds":0.2,"host":"b","node_rank":1,"ts":120.2}"#,
        r#"{"event":"generation_stepping","cycle":0,"generation":1,"seconds":0.6,"host":"b","node_rank":1,"ts":120.7}"#,
        r#"{"event":"generation","cycle":0,"generation":2,"ranks":[1],"step":130,"host":"b","node_rank":1,"ts":140.3}"#,
        r#"{"event":"cycle_ended","cycle":0,"end":"failed","node":0,"reason":"peer","host":"b","node_rank":1,"ts":151.0}"#,
        r#"{"event":"cycle_start","cycle":1,"host":"b","node_rank":1,"ts":155.0}"#,
        r#"{"event":"cycle_ended","cycle":1,"end":"done","host":"b","node_rank":1,"ts":169.0}"#,
        r#"{"event":"result","outcome":"succeeded","exit_code":0,"host":"b","node_rank":1,"ts":169.0}"#,
    ];
    history_of_nodes(&[n0, n1])
}

#[test]
fn a_generation_recovered_in_process_is_its_own_category_and_loses_nothing() {
    let t = timeline(&two_generations());
    let at = &t.allocations[0].attempts[0];
    let gens: Vec<_> = at
        .generations
        .iter()
        .map(|g| (g.generation, g.ranks.clone(), g.failed_at, g.stepping_at))
        .collect();
    // Each from its rank's exit; generation 1 trains again when the last node's ranks step.
    assert_eq!(
        gens,
        vec![(1, vec![2], 120.0, Some(120.7)), (2, vec![1], 140.0, None)]
    );
    // The failure recovered in process is not the attempt's: the one that was not is.
    assert_eq!(at.failed_at, Some(140.0));
    let g = compute(&t);
    sums_to_wall(&g);
    let b = &g.breakdown;
    assert!(
        (b.get(Category::InProcessRecovery) - 0.7).abs() < 1e-9,
        "{b:?}"
    );
    // From the second failure to attempt 1's start, as any failure.
    assert!(
        (b.get(Category::FailureHandling) - 15.0).abs() < 1e-9,
        "{b:?}"
    );
    // Kept: 101..120 and 120.7 up to step 101 (interpolated between steps 45 and 130), then
    // attempt 1's 158..168; redone: from step 101 to the failure at 140.
    let step_101 = 121.0 + 56.0 / 85.0 * 18.0;
    let kept = 19.0 + (step_101 - 120.7) + 10.0;
    assert!((b.get(Category::Goodput) - kept).abs() < 1e-6, "{b:?}");
    assert!(
        (b.get(Category::LostProgress) - (140.0 - step_101)).abs() < 1e-6,
        "{b:?}"
    );
    let costs: Vec<_> = g
        .generations
        .iter()
        .map(|c| {
            (
                c.generation,
                c.recovery_s.map(|s| (s * 10.0).round()),
                c.steps_lost,
            )
        })
        .collect();
    assert_eq!(costs, vec![(1, Some(7.0), Some(0)), (2, None, Some(29))]);
    let table = render_table(&g);
    assert!(table.contains("in-process recovery"), "{table}");
    assert!(
        table.contains("attempt 0, generation 1: rank 2 replaced at step 40; every rank stepping again after 0.70s; lost: nothing"),
        "{table}"
    );
    assert!(
        table.contains("generation 2: rank 1 replaced at step 130; not recovered in process, the whole job restarted; lost: 29 steps"),
        "{table}"
    );
    let json = serde_json::to_value(&g).unwrap();
    assert!((json["breakdown"]["in_process_recovery"].as_f64().unwrap() - 0.7).abs() < 1e-9);
    assert_eq!(json["generations"][1]["steps_lost"], 29);
}

#[test]
fn a_generation_one_node_never_saw_step_again_is_not_recovered() {
    // Without node 1's `generation_stepping`, generation 1 did not train again job-wide.
    let mut h = two_generations();
    for r in &mut h.runs {
        r.gen_marks
            .retain(|m| !(r.node_rank == 1 && m.kind == crate::history::GenerationKind::Stepping));
    }
    let t = timeline(&h);
    let at = &t.allocations[0].attempts[0];
    assert_eq!(at.generations[0].stepping_at, None);
    // Its failure is the attempt's (counted from the last steps record, as any failure).
    assert_eq!(at.failed_at, Some(139.0));
    let g = compute(&t);
    sums_to_wall(&g);
    assert_eq!(g.breakdown.get(Category::InProcessRecovery), 0.0);
}
