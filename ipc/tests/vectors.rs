//! Checks the codec against `testdata/vectors.txt` (layout described in docs/protocol.md).

use serde_json::{json, Value};
use vigil_ipc::{
    decode_agent_frame, decode_rank_frame, encode_agent, encode_rank, AgentMsg, RankMsg,
};

const VECTORS: &str = include_str!("../testdata/vectors.txt");

fn hex(s: &str) -> Vec<u8> {
    assert_eq!(s.len() % 2, 0, "odd hex length: {s}");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

fn opt(v: Option<u64>) -> Value {
    v.map_or(Value::Null, Value::from)
}

fn json_opt(v: &Value) -> Option<u64> {
    if v.is_null() {
        None
    } else {
        Some(v.as_u64().expect("u64"))
    }
}

fn u32_of(v: &Value) -> u32 {
    u32::try_from(v.as_u64().expect("u64")).expect("fits u32")
}

fn str_of(v: &Value) -> String {
    v.as_str().expect("string").to_owned()
}

fn rank_to_json(m: &RankMsg) -> Value {
    match m {
        RankMsg::Register {
            rank,
            local_rank,
            pid,
            attempt,
        } => {
            json!({"type": "Register", "rank": rank, "local_rank": local_rank, "pid": pid, "cycle": attempt})
        }
        RankMsg::Heartbeat { step } => json!({"type": "Heartbeat", "step": opt(*step)}),
        RankMsg::SectionStart { name } => json!({"type": "SectionStart", "name": name}),
        RankMsg::SectionEnd { name } => json!({"type": "SectionEnd", "name": name}),
        RankMsg::EndAllSections => json!({"type": "EndAllSections"}),
        RankMsg::StepTiming { step, duration_us } => {
            json!({"type": "StepTiming", "step": step, "duration_us": duration_us})
        }
        RankMsg::Finished => json!({"type": "Finished"}),
        RankMsg::Progress { step } => json!({"type": "Progress", "step": step}),
        RankMsg::HoldsSignals { signals } => json!({"type": "HoldsSignals", "signals": signals}),
        RankMsg::Signalled { signal } => json!({"type": "Signalled", "signal": signal}),
        RankMsg::Restartable { generation } => {
            json!({"type": "Restartable", "generation": generation})
        }
        RankMsg::Raised { error } => json!({"type": "Raised", "error": error}),
        RankMsg::WorkloadControl {
            action,
            description,
        } => json!({"type": "WorkloadControl", "action": action, "description": description}),
        RankMsg::CalculateTimeouts {
            heartbeat,
            out_of_section,
            all_sections,
            sections,
        } => json!({"type": "CalculateTimeouts", "heartbeat": heartbeat,
            "out_of_section": out_of_section, "all_sections": all_sections, "sections": sections}),
    }
}

fn rank_from_json(v: &Value) -> RankMsg {
    match v["type"].as_str().expect("type") {
        "Register" => RankMsg::Register {
            rank: u32_of(&v["rank"]),
            local_rank: u32_of(&v["local_rank"]),
            pid: u32_of(&v["pid"]),
            attempt: u32_of(&v["cycle"]),
        },
        "Heartbeat" => RankMsg::Heartbeat {
            step: json_opt(&v["step"]),
        },
        "SectionStart" => RankMsg::SectionStart {
            name: str_of(&v["name"]),
        },
        "SectionEnd" => RankMsg::SectionEnd {
            name: str_of(&v["name"]),
        },
        "EndAllSections" => RankMsg::EndAllSections,
        "StepTiming" => RankMsg::StepTiming {
            step: v["step"].as_u64().expect("u64"),
            duration_us: v["duration_us"].as_u64().expect("u64"),
        },
        "Finished" => RankMsg::Finished,
        "Progress" => RankMsg::Progress {
            step: v["step"].as_u64().expect("u64"),
        },
        "HoldsSignals" => RankMsg::HoldsSignals {
            signals: v["signals"].as_u64().expect("u64"),
        },
        "Signalled" => RankMsg::Signalled {
            signal: u32_of(&v["signal"]),
        },
        "Restartable" => RankMsg::Restartable {
            generation: v["generation"].as_u64().expect("u64"),
        },
        "Raised" => RankMsg::Raised {
            error: str_of(&v["error"]),
        },
        "WorkloadControl" => RankMsg::WorkloadControl {
            action: v["action"].as_u64().expect("u64") as u8,
            description: str_of(&v["description"]),
        },
        "CalculateTimeouts" => RankMsg::CalculateTimeouts {
            heartbeat: v["heartbeat"].as_bool().expect("bool"),
            out_of_section: v["out_of_section"].as_bool().expect("bool"),
            all_sections: v["all_sections"].as_bool().expect("bool"),
            sections: v["sections"]
                .as_array()
                .expect("array")
                .iter()
                .map(str_of)
                .collect(),
        },
        other => panic!("unknown rank message type {other}"),
    }
}

fn agent_to_json(m: &AgentMsg) -> Value {
    match m {
        AgentMsg::Timeouts {
            initial_ms,
            heartbeat_ms,
            out_of_section_ms,
            sections,
        } => json!({
            "type": "Timeouts",
            "initial_ms": opt(*initial_ms),
            "heartbeat_ms": opt(*heartbeat_ms),
            "out_of_section_ms": opt(*out_of_section_ms),
            "sections": sections.iter().map(|(n, ms)| json!([n, ms])).collect::<Vec<_>>(),
        }),
        AgentMsg::StopRequest { reason, at_step } => {
            json!({"type": "StopRequest", "reason": reason, "at_step": opt(*at_step)})
        }
        AgentMsg::TimeoutsCalculated {
            heartbeat,
            sections,
            out_of_section,
        } => json!({"type": "TimeoutsCalculated", "heartbeat": heartbeat, "sections": sections,
            "out_of_section": out_of_section}),
        AgentMsg::Generation {
            generation,
            replaced,
        } => json!({"type": "Generation", "generation": generation, "replaced": replaced}),
    }
}

fn agent_from_json(v: &Value) -> AgentMsg {
    match v["type"].as_str().expect("type") {
        "Timeouts" => AgentMsg::Timeouts {
            initial_ms: json_opt(&v["initial_ms"]),
            heartbeat_ms: json_opt(&v["heartbeat_ms"]),
            out_of_section_ms: json_opt(&v["out_of_section_ms"]),
            sections: v["sections"]
                .as_array()
                .expect("array")
                .iter()
                .map(|p| (str_of(&p[0]), p[1].as_u64().expect("u64")))
                .collect(),
        },
        "StopRequest" => AgentMsg::StopRequest {
            reason: str_of(&v["reason"]),
            at_step: json_opt(&v["at_step"]),
        },
        "TimeoutsCalculated" => AgentMsg::TimeoutsCalculated {
            heartbeat: v["heartbeat"].as_bool().expect("bool"),
            sections: v["sections"].as_bool().expect("bool"),
            out_of_section: v["out_of_section"].as_bool().expect("bool"),
        },
        "Generation" => AgentMsg::Generation {
            generation: v["generation"].as_u64().expect("u64"),
            replaced: v["replaced"]
                .as_array()
                .expect("array")
                .iter()
                .map(u32_of)
                .collect(),
        },
        other => panic!("unknown agent message type {other}"),
    }
}

struct Counts {
    rank: usize,
    agent: usize,
    error: usize,
    rank_types: std::collections::BTreeSet<String>,
    agent_types: std::collections::BTreeSet<String>,
    error_kinds: std::collections::BTreeSet<String>,
}

fn run_vectors() -> Counts {
    let mut c = Counts {
        rank: 0,
        agent: 0,
        error: 0,
        rank_types: Default::default(),
        agent_types: Default::default(),
        error_kinds: Default::default(),
    };
    for (lineno, line) in VECTORS.lines().enumerate() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let cols: Vec<&str> = line.split('\t').collect();
        assert_eq!(cols.len(), 3, "line {}: expected 3 columns", lineno + 1);
        let bytes = hex(cols[1]);
        let meaning: Value = serde_json::from_str(cols[2]).expect("JSON meaning");
        let at = format!("line {}", lineno + 1);
        match cols[0] {
            "rank" => {
                let (msg, used) = decode_rank_frame(&bytes).unwrap_or_else(|e| panic!("{at}: {e}"));
                assert_eq!(used, bytes.len(), "{at}");
                assert_eq!(rank_to_json(&msg), meaning, "{at}");
                assert_eq!(rank_from_json(&meaning), msg, "{at}");
                let mut out = Vec::new();
                encode_rank(&msg, &mut out);
                assert_eq!(out, bytes, "{at}: re-encoding differs");
                c.rank += 1;
                c.rank_types
                    .insert(meaning["type"].as_str().unwrap().to_owned());
            }
            "agent" => {
                let (msg, used) =
                    decode_agent_frame(&bytes).unwrap_or_else(|e| panic!("{at}: {e}"));
                assert_eq!(used, bytes.len(), "{at}");
                assert_eq!(agent_to_json(&msg), meaning, "{at}");
                assert_eq!(agent_from_json(&meaning), msg, "{at}");
                let mut out = Vec::new();
                encode_agent(&msg, &mut out);
                assert_eq!(out, bytes, "{at}: re-encoding differs");
                c.agent += 1;
                c.agent_types
                    .insert(meaning["type"].as_str().unwrap().to_owned());
            }
            "error" => {
                let want = meaning["error"].as_str().expect("error kind");
                let got = match meaning["direction"].as_str().expect("direction") {
                    "rank" => decode_rank_frame(&bytes).map(|_| ()),
                    "agent" => decode_agent_frame(&bytes).map(|_| ()),
                    d => panic!("{at}: unknown direction {d}"),
                };
                let err = got.expect_err(&at);
                assert_eq!(err.kind(), want, "{at}: got {err:?}");
                c.error += 1;
                c.error_kinds.insert(want.to_owned());
            }
            m => panic!("{at}: unknown marker {m}"),
        }
    }
    c
}

#[test]
fn every_vector_decodes_to_its_meaning_and_reencodes_identically() {
    let c = run_vectors();
    assert!(c.rank >= 20 && c.agent >= 8 && c.error >= 40);
    let all = |s: &[&str]| s.iter().map(|x| x.to_string()).collect();
    assert_eq!(
        c.rank_types,
        all(&[
            "CalculateTimeouts",
            "EndAllSections",
            "Finished",
            "Heartbeat",
            "HoldsSignals",
            "Progress",
            "Raised",
            "Register",
            "Restartable",
            "SectionEnd",
            "SectionStart",
            "Signalled",
            "StepTiming",
            "WorkloadControl"
        ])
    );
    assert_eq!(
        c.agent_types,
        all(&[
            "Generation",
            "StopRequest",
            "Timeouts",
            "TimeoutsCalculated"
        ])
    );
    assert_eq!(
        c.error_kinds,
        all(&[
            "bad_flags",
            "bad_length",
            "bad_magic",
            "bad_presence",
            "incomplete",
            "invalid_utf8",
            "name_too_long",
            "payload_too_large",
            "reason_too_long",
            "too_many_sections",
            "trailing_bytes",
            "truncated",
            "unknown_kind",
            "unsupported_version"
        ])
    );
}
