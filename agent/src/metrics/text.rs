//! Prometheus' text exposition format, version 0.0.4: `# HELP` and `# TYPE` lines, then one line
//! per sample, `name{label="value",...} value`. Label values are escaped as the format says
//! (backslash, double quote, newline); help text escapes backslash and newline.

use std::fmt::Write;

/// The content type of a page in this format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

/// A label value as the format writes it between double quotes.
pub fn escape_label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Help text as the format writes it: backslash and newline escaped.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A sample value: integers without a fraction, `NaN`, `+Inf`, `-Inf`.
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v == v.trunc() && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// A page being written: each family's header, then its samples, families one after another.
#[derive(Debug, Default)]
pub struct Page {
    out: String,
}

impl Page {
    /// Starts a family: its `# HELP` and `# TYPE` lines. Its samples follow, before the next.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.name());
    }

    /// One sample of the family last started. Labels whose value is `None` are left out.
    pub fn sample(&mut self, name: &str, labels: &[(&str, Option<&str>)], value: f64) {
        self.out.push_str(name);
        let mut first = true;
        for (k, v) in labels {
            let Some(v) = v else { continue };
            self.out.push(if first { '{' } else { ',' });
            first = false;
            let _ = write!(self.out, "{k}=\"{}\"", escape_label_value(v));
        }
        if !first {
            self.out.push('}');
        }
        self.out.push(' ');
        self.out.push_str(&format_value(value));
        self.out.push('\n');
    }

    pub fn finish(self) -> String {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Reads an escaped label value back, as Prometheus' parser does.
    fn unescape(s: &str) -> String {
        let mut out = String::new();
        let mut it = s.chars();
        while let Some(c) = it.next() {
            if c == '\\' {
                match it.next() {
                    Some('n') => out.push('\n'),
                    Some(o) => out.push(o),
                    None => out.push('\\'),
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    #[test]
    fn label_values_escape_backslash_quote_and_newline() {
        assert_eq!(escape_label_value(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(escape_label_value("two\nlines"), "two\\nlines");
        assert_eq!(escape_label_value("plain-GPU-1f2e"), "plain-GPU-1f2e");
    }

    #[test]
    fn a_family_has_help_type_and_its_samples() {
        let mut p = Page::default();
        p.family(
            "vigil_restarts_total",
            Kind::Counter,
            "Restarts.\nTwo lines \\ here.",
        );
        p.sample(
            "vigil_restarts_total",
            &[
                ("job_id", Some("j\"1")),
                ("gpu", None),
                ("node", Some("n1")),
            ],
            3.0,
        );
        p.sample("vigil_restarts_total", &[], 0.5);
        assert_eq!(
            p.finish(),
            "# HELP vigil_restarts_total Restarts.\\nTwo lines \\\\ here.\n\
             # TYPE vigil_restarts_total counter\n\
             vigil_restarts_total{job_id=\"j\\\"1\",node=\"n1\"} 3\n\
             vigil_restarts_total 0.5\n"
        );
    }

    #[test]
    fn values_are_written_as_the_format_reads_them() {
        assert_eq!(format_value(2.0), "2");
        assert_eq!(format_value(-0.25), "-0.25");
        assert_eq!(format_value(f64::NAN), "NaN");
        assert_eq!(format_value(f64::INFINITY), "+Inf");
        assert_eq!(format_value(f64::NEG_INFINITY), "-Inf");
        assert_eq!(format_value(1e20).parse::<f64>().unwrap(), 1e20);
    }

    proptest! {
        #[test]
        fn any_label_value_reads_back_and_stays_on_one_line(v in any::<String>()) {
            let e = escape_label_value(&v);
            prop_assert!(!e.contains('\n'));
            // Every double quote in the escaped text is escaped.
            let bare_quote = e.char_indices().any(|(i, c)| {
                c == '"' && e[..i].chars().rev().take_while(|c| *c == '\\').count() % 2 == 0
            });
            prop_assert!(!bare_quote);
            prop_assert_eq!(unescape(&e), v);
        }

        #[test]
        fn any_finite_value_reads_back(v in any::<f64>().prop_filter("finite", |v| v.is_finite())) {
            prop_assert_eq!(format_value(v).parse::<f64>().unwrap(), v);
        }
    }
}
