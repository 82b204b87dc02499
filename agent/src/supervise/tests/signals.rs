//! Signals to the agent: forwarded, escalated, the window they bring.

use super::*;

#[test]
fn a_signal_brings_its_window_and_holds_to_it() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(2, 0));
    spawn_all(&mut s, t, 100);
    let window = Duration::from_secs(5);
    s.handle(
        t,
        Event::Signal {
            signal: SIGTERM,
            window,
        },
    );
    // Another event between keeps the window the signal brought.
    let early = s.handle(t + Duration::from_secs(4), Event::Tick);
    assert!(signals(&early).is_empty());
    let a = s.handle(t + window, Event::Tick);
    assert_eq!(signals(&a), vec![(vec![100, 101], SIGKILL)]);
}

#[test]
fn signal_is_forwarded_and_never_restarts() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(2, 5));
    spawn_all(&mut s, t, 100);
    let a = s.handle(t, signal(&s, libc::SIGHUP));
    assert_eq!(signals(&a), vec![(vec![100, 101], libc::SIGHUP)]);
    assert_eq!(s.next_deadline(), Some(t + Duration::from_secs(30)));
    s.handle(
        t,
        Event::Reaped {
            pid: 100,
            how: ExitKind::Code(1),
        },
    );
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 101,
            how: ExitKind::Signal(libc::SIGHUP),
        },
    );
    let o = finish(&a).unwrap();
    assert_eq!(
        o,
        &Outcome::Signaled {
            signal: libc::SIGHUP
        }
    );
    assert_eq!(o.exit_code(), 128 + libc::SIGHUP);
    assert!(spawns(&a).is_empty());
}

#[test]
fn second_sigint_escalates_at_once() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(1, 0));
    spawn_all(&mut s, t, 100);
    s.handle(t, signal(&s, SIGINT));
    let t1 = t + Duration::from_millis(200);
    s.handle(t1, signal(&s, SIGINT));
    assert_eq!(s.next_deadline(), Some(t1));
    let a = s.handle(t1, Event::Tick);
    assert_eq!(signals(&a), vec![(vec![100], SIGKILL)]);
}

#[test]
fn signal_during_failure_stop_cancels_restart() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(2, 5));
    spawn_all(&mut s, t, 100);
    s.handle(
        t,
        Event::Reaped {
            pid: 100,
            how: ExitKind::Code(1),
        },
    );
    let a = s.handle(t, signal(&s, SIGTERM));
    assert_eq!(signals(&a), vec![(vec![101], SIGTERM)]);
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 101,
            how: ExitKind::Code(0),
        },
    );
    assert_eq!(finish(&a), Some(&Outcome::Signaled { signal: SIGTERM }));
}
