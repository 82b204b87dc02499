//! Rendering, pure: the sbatch script of a job or an interactive allocation, its `attach.sh`,
//! and NVIDIA Base Command's `ngc base-command job run` line. Golden files in tests/launch/ pin
//! the output.

use std::fmt::Write;
use std::path::Path;

use crate::recipe::{slurm_time_secs, Job, Mount};

/// A word for bash: as is when it is plain, else single-quoted.
pub fn sh_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'-' | b'_' | b'.' | b'/' | b':' | b'=' | b',' | b'@' | b'+' | b'%'
                )
        });
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// An environment value in double quotes, as data: `$NAME`, `${NAME}` and `${NAME:-WORD}` (WORD
/// plain text) expand in the batch script (a preset's `${LD_LIBRARY_PATH:-}`); every other `$`
/// (command substitution `$(...)`, arithmetic, `${X/...}`), `"`, `\` and backquotes are literal.
fn dq(s: &str) -> String {
    let mut out = String::from("\"");
    let mut i = 0;
    while i < s.len() {
        let rest = &s[i..];
        let c = rest.chars().next().expect("i is below the length");
        if c == '$' {
            if let Some(n) = expansion_len(rest) {
                out.push_str(&rest[..n]);
                i += n;
                continue;
            }
        }
        if matches!(c, '"' | '\\' | '`' | '$') {
            out.push('\\');
        }
        out.push(c);
        i += c.len_utf8();
    }
    out.push('"');
    out
}

/// The length of the variable expansion `rest` starts with, if it is one that runs nothing:
/// `$NAME`, `${NAME}`, `${NAME:-WORD}` or `${NAME-WORD}` with WORD free of `$`, quotes,
/// backslashes, backquotes and braces.
fn expansion_len(rest: &str) -> Option<usize> {
    let b = rest.as_bytes();
    let name_len = |from: usize| -> usize {
        let mut j = from;
        while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
            j += 1;
        }
        if j > from && !b[from].is_ascii_digit() {
            j - from
        } else {
            0
        }
    };
    if b.get(1) != Some(&b'{') {
        let n = name_len(1);
        return (n > 0).then_some(1 + n);
    }
    let n = name_len(2);
    if n == 0 {
        return None;
    }
    let mut j = 2 + n;
    if b.get(j) == Some(&b'}') {
        return Some(j + 1);
    }
    if b.get(j) == Some(&b':') {
        j += 1;
    }
    if b.get(j) != Some(&b'-') {
        return None;
    }
    j += 1;
    while j < b.len() && !matches!(b[j], b'$' | b'"' | b'\'' | b'\\' | b'`' | b'{' | b'}') {
        j += 1;
    }
    (b.get(j) == Some(&b'}')).then_some(j + 1)
}

/// Where an experiment lives and what it is called; the parts of a script that are not the
/// recipe's.
pub struct Target<'a> {
    pub id: &'a str,
    pub dir: &'a Path,
    /// The recipe file, for the script's header; None when every field came from flags.
    pub recipe: Option<&'a str>,
}

fn header(job: &Job, t: &Target, requeue: bool) -> String {
    let mut s = String::from("#!/bin/bash\n");
    let from = t.recipe.map(|r| format!(" from {r}")).unwrap_or_default();
    let _ = writeln!(s, "# Rendered by vigil launch{from}: experiment {}.", t.id);
    let mut sb = |l: String| {
        let _ = writeln!(s, "#SBATCH {l}");
    };
    sb(format!("--job-name={}", job.name));
    sb(format!("--nodes={}", job.nodes));
    sb("--ntasks-per-node=1".into());
    if job.gpus_per_node > 0 {
        sb(format!("--gpus-per-node={}", job.gpus_per_node));
    }
    if let Some(p) = &job.partition {
        sb(format!("--partition={p}"));
    }
    if let Some(a) = &job.account {
        sb(format!("--account={a}"));
    }
    if let Some(tm) = &job.time {
        sb(format!("--time={tm}"));
    }
    sb(format!(
        "--output={}",
        sh_quote(&format!("{}/%j.log", t.dir.display()))
    ));
    sb("--open-mode=append".into());
    sb(if requeue { "--requeue" } else { "--no-requeue" }.into());
    sb(format!(
        "--chdir={}",
        sh_quote(&job.workdir.display().to_string())
    ));
    // The submitting environment passes on (secrets by name among it); nothing is written here.
    sb("--export=ALL".into());
    s
}

fn env_lines(job: &Job, s: &mut String) {
    if !job.env.is_empty() {
        s.push('\n');
    }
    for (k, v) in &job.env {
        let _ = writeln!(s, "export {k}={}", dq(v));
    }
    if !job.secrets.is_empty() {
        let _ = writeln!(
            s,
            "\n# Secrets pass by name from the submitting environment, never by value: {}",
            job.secrets.join(" ")
        );
    }
}

/// One line when the srun line would run a `vigil_bin` that the container cannot see: not
/// mounted (no mount's target holds it) and not the plain `vigil` the image's PATH finds. The
/// experiment directory `dir` is mounted too. A warning only: the image may hold that path.
pub fn unseen_vigil(job: &Job, dir: &Path) -> Option<String> {
    job.image.as_ref()?;
    let bin = Path::new(&job.vigil_bin);
    let plain = !job.vigil_bin.contains('/');
    let mounted = job.mount_vigil
        || bin.starts_with(dir)
        || job.mounts.iter().any(|m| bin.starts_with(&m.dst));
    if plain || mounted {
        return None;
    }
    Some(format!(
        "vigil_bin {} is under no mounted directory, so the container runs it from the image, which may not hold it (nor the rank library `import vigil`): install the vigil wheel in the image and set vigil_bin = \"vigil\" (docs/install.md), or mount its directory (mounts = [\"{}:{}:ro\"])",
        job.vigil_bin,
        bin.parent().unwrap_or(bin).display(),
        bin.parent().unwrap_or(bin).display()
    ))
}

/// srun's container flags (pyxis), one per line, or nothing without an image.
fn container_flags(job: &Job, dir: &Path) -> Vec<String> {
    let Some(img) = &job.image else {
        return vec![];
    };
    let mut f = vec![format!("--container-image={}", sh_quote(img))];
    let mut mounts: Vec<String> = job.mounts.iter().map(|m| m.render()).collect();
    // vigil writes its logs and state into the experiment directory, from inside.
    mounts.push(Mount::same(dir).render());
    if job.mount_vigil {
        mounts.push(Mount::same(Path::new(&job.vigil_bin)).render());
    }
    if !mounts.is_empty() {
        f.push(format!(
            "--container-mounts={}",
            sh_quote(&mounts.join(","))
        ));
    }
    f.push(format!(
        "--container-workdir={}",
        sh_quote(&job.workdir.display().to_string())
    ));
    if !job.secrets.is_empty() {
        f.push(format!("--container-env={}", job.secrets.join(",")));
    }
    f
}

/// `vigil run`'s words after the binary: the node's ranks, the experiment's directories, the
/// recipe's options, the script and its arguments.
fn vigil_run_words(job: &Job, dir: &str, extra: &[String]) -> Vec<String> {
    let mut w: Vec<String> = vec!["run".into()];
    w.extend(extra.iter().cloned());
    if let Some(st) = &job.store {
        w.extend(st.args.iter().cloned());
    }
    w.extend([
        "--nproc-per-node".into(),
        job.nproc_per_node.to_string(),
        "--log-dir".into(),
        format!("{dir}/runs"),
        "--state-dir".into(),
        format!("{dir}/state"),
    ]);
    w.extend(job.vigil_args.iter().cloned());
    if let Some(s) = &job.script {
        w.push(s.clone());
    }
    w.extend(job.args.iter().cloned());
    w
}

/// The `vigil run` line of a Slurm job as node rank 0 will run it (Slurm's variables given their
/// values), for the agent's parser to check before submitting.
pub fn slurm_run_line(job: &Job, dir: &Path) -> crate::RunLine {
    let nodes = job.nodes.to_string();
    let extra = [
        "--nnodes".to_string(),
        nodes,
        "--rdzv-id".into(),
        "1".into(),
    ];
    let mut words = vigil_run_words(job, &dir.display().to_string(), &extra);
    words.remove(0);
    crate::RunLine {
        words,
        nodes: job.nodes,
        gpus_per_node: job.gpus_per_node,
    }
}

/// The `vigil run` line of a BCP job, for the same check.
pub fn bcp_run_line(job: &Job) -> crate::RunLine {
    let time = job.time.clone().unwrap_or_default();
    let mut words = vigil_run_words(job, "/results/vigil", &["--time-limit".into(), time]);
    words.remove(0);
    crate::RunLine {
        words,
        nodes: job.nodes,
        gpus_per_node: job.gpus_per_node,
    }
}

/// The batch script of a training job: `srun vigil run` on every node.
pub fn sbatch(job: &Job, t: &Target) -> String {
    let mut s = header(job, t, true);
    env_lines(job, &mut s);
    let dir = t.dir.display().to_string();
    match &job.store {
        // The service's secret is fixed: read from its file when the job runs, never written here.
        Some(st) => {
            let _ = write!(
                s,
                "\n# The store outside the job ({}:{}): its secret, read from the file at run time.\n\
                 export VIGIL_STORE_SECRET=\"$(cat {})\"\n\n",
                st.host,
                st.port,
                sh_quote(&st.secret_file.to_string_lossy())
            );
        }
        None => s.push_str(
            "\n# vigil's own store secret, the same on every node of this allocation.\n\
             export VIGIL_STORE_SECRET=\"${VIGIL_STORE_SECRET:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \\n')}\"\n\n",
        ),
    }
    s.push_str(&slurm_facts(&dir));
    // vigil requeues the job itself (docs/allocations.md): srun must not kill the other nodes'
    // agents when one exits non-zero, they agree on the outcome themselves.
    let mut lines = vec!["srun --kill-on-bad-exit=0".to_string()];
    lines.extend(container_flags(job, t.dir));
    let words = |w: &[String]| w.iter().map(|w| sh_quote(w)).collect::<Vec<_>>().join(" ");
    let dir_s = |sub: &str| sh_quote(&format!("{dir}/{sub}"));
    lines.push(format!(
        "{} run --nnodes \"$SLURM_NNODES\" --nproc-per-node {} --rdzv-id \"$SLURM_JOB_ID\"",
        sh_quote(&job.vigil_bin),
        job.nproc_per_node
    ));
    if let Some(st) = &job.store {
        lines.push(words(&st.args));
    }
    lines.push(format!(
        "--log-dir {} --state-dir {}",
        dir_s("runs"),
        dir_s("state")
    ));
    if !job.vigil_args.is_empty() {
        lines.push(words(&job.vigil_args));
    }
    let mut script: Vec<String> = job.script.iter().cloned().collect();
    script.extend(job.args.iter().cloned());
    lines.push(words(&script));
    s.push_str(&lines.join(" \\\n    "));
    s.push('\n');
    s.push_str(
        "# vigil could not requeue the job itself (no scontrol in the container): it asked for it here.\n\
         if [ -e \"$VIGIL_REQUEUE_FILE\" ]; then scontrol requeue \"$SLURM_JOB_ID\"; fi\n",
    );
    s
}

/// Before `srun`: what vigil cannot ask Slurm inside a container (no `squeue`, `scontrol` or
/// munge socket in most images), read here and passed in the environment, and the file vigil
/// asks for a requeue in (docs/launch.md, "Inside a container").
fn slurm_facts(dir: &str) -> String {
    format!(
        r#"# What vigil cannot ask Slurm from inside a container: the end time, KillWait, GraceTime.
export SLURM_JOB_END_TIME="${{SLURM_JOB_END_TIME:-$(SLURM_TIME_FORMAT=%s squeue -h -j "$SLURM_JOB_ID" -o %e)}}"
export VIGIL_SLURM_KILL_WAIT="$(scontrol show config | sed -n 's/^KillWait *= *\([0-9]*\).*/\1/p')"
export VIGIL_SLURM_GRACE_TIME="$(scontrol show partition "$SLURM_JOB_PARTITION" | sed -n 's/.*GraceTime=\([0-9]*\).*/\1/p')"
# Where vigil (node rank 0) asks for a requeue it cannot make itself (no trap on SIGTERM: a
# scancel must end this script, not see it requeue the job).
export VIGIL_REQUEUE_FILE={}."$SLURM_JOB_ID"
rm -f "$VIGIL_REQUEUE_FILE"

"#,
        sh_quote(&format!("{dir}/state/requeue"))
    )
}

/// The batch script of an interactive allocation: it holds the nodes until the time limit or
/// `vigil cancel`; `attach.sh` runs commands inside.
pub fn sbatch_interactive(job: &Job, t: &Target) -> String {
    let mut s = header(job, t, false);
    env_lines(job, &mut s);
    // The path is quoted on its own, outside the double quotes: `$(...)` in it stays text.
    let attach = sh_quote(&format!("{}/attach.sh", t.dir.display()));
    let _ = write!(
        s,
        "\necho \"[vigil] interactive allocation $SLURM_JOB_ID on $SLURM_JOB_NODELIST: attach with bash \"{attach}\" [COMMAND...]\"\n\
         exec sleep infinity\n"
    );
    s
}

/// `attach.sh`: waits until the allocation runs, then a shell (or the given command) on its
/// first node. Running it again after a dropped connection attaches again: the allocation
/// outlives any one connection.
pub fn attach_sh(job: &Job, t: &Target, job_id: &str) -> String {
    let container: String = container_flags(job, t.dir)
        .iter()
        .map(|f| format!(" {f}"))
        .collect();
    format!(
        r#"#!/bin/bash
# Attach to interactive experiment {id} (Slurm job {job_id}). Run it again after a dropped
# connection: the allocation holds its nodes until its time limit or `vigil cancel {id}`.
#   bash attach.sh            a shell on the allocation's first node
#   bash attach.sh CMD ARGS   that command there instead
job={job_id}
while :; do
    state=$(squeue -h -j "$job" -o %T 2>/dev/null)
    case "$state" in
        RUNNING) break ;;
        PENDING|CONFIGURING|REQUEUED|RESIZING)
            echo "attach.sh: job $job is $state; waiting for its nodes" >&2
            sleep 2 ;;
        *)
            echo "attach.sh: job $job is ${{state:-no longer known to Slurm}}: the allocation has ended; start another with vigil launch --interactive" >&2
            exit 1 ;;
    esac
done
if [ $# -eq 0 ]; then
    exec srun --jobid="$job" --overlap --nodes=1 --ntasks=1 --pty{container} bash -l
fi
exec srun --jobid="$job" --overlap --nodes=1 --ntasks=1{container} "$@"
"#,
        id = t.id,
    )
}

/// BCP's `--total-runtime` for a Slurm time limit: whole hours, minutes or seconds.
fn runtime(secs: u64) -> String {
    if secs % 3600 == 0 {
        format!("{}h", secs / 3600)
    } else if secs % 60 == 0 {
        format!("{}m", secs / 60)
    } else {
        format!("{secs}s")
    }
}

/// The `ngc base-command job run` command line (seeds/001's form), with vigil as the command
/// on every replica; the time limit is passed to vigil too, so that it checkpoints before BCP's
/// hard stop. Results, vigil's logs and state go to `/results`.
pub fn bcp(job: &Job) -> Result<String, crate::Error> {
    let Some(instance) = &job.instance else {
        return crate::err(
            "--executor bcp needs the instance type: add instance = \"dgxa100.80g.8.norm\" (or --set instance=...)",
        );
    };
    let Some(image) = &job.image else {
        return crate::err(
            "--executor bcp needs a container image: add image = \"nvcr.io/nvidia/nemo:24.05\"",
        );
    };
    let Some(time) = &job.time else {
        return crate::err(
            "--executor bcp needs a time limit for --total-runtime: add time = \"10:00:00\"",
        );
    };
    let secs = slurm_time_secs(time).unwrap_or(0);
    let words = vigil_run_words(
        job,
        "/results/vigil",
        &["--time-limit".into(), time.clone()],
    );
    let mut cmd = sh_quote(&job.vigil_bin);
    for w in &words {
        cmd.push(' ');
        cmd.push_str(&sh_quote(w));
    }
    if job.workdir_set {
        cmd = format!(
            "cd {} && {cmd}",
            sh_quote(&job.workdir.display().to_string())
        );
    }
    let mut l = vec![
        "ngc base-command job run".to_string(),
        format!("--name {}", sh_quote(&job.name)),
        format!("--instance {}", sh_quote(instance)),
        format!("--total-runtime {}", runtime(secs)),
        format!("--image {}", sh_quote(image)),
        "--result /results".into(),
    ];
    if job.nodes > 1 {
        l.push("--array-type \"PYTORCH\"".into());
        l.push(format!("--replicas {}", job.nodes));
    }
    for m in &job.workspaces {
        // On BCP a mount is a workspace: `workspace:/mount_point[:RW|RO]`.
        l.push(format!("--workspace {}", sh_quote(&m.render())));
    }
    for (k, v) in &job.env {
        l.push(format!("--env-var {}", sh_quote(&format!("{k}:{v}"))));
    }
    for s in &job.secrets {
        l.push(format!("--secret {s}"));
    }
    l.push(format!("--commandline {}", sh_quote(&cmd)));
    Ok(l.join(" \\\n    ") + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(sh_quote("a/b.py"), "a/b.py");
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(sh_quote(""), "''");
        assert_eq!(sh_quote("$HOME"), "'$HOME'");
        assert_eq!(dq("a\"b`c\\$X"), r#""a\"b\`c\\$X""#);
        assert_eq!(
            dq("/l:${LD_LIBRARY_PATH:-}"),
            r#""/l:${LD_LIBRARY_PATH:-}""#
        );
        assert_eq!(dq("$(touch x)"), r#""\$(touch x)""#);
        assert_eq!(dq("${X:-$(id)}"), r#""\${X:-\$(id)}""#);
        assert_eq!(
            dq("$((1+1)) $1 ${X/a/b} ${Y}z $"),
            r#""\$((1+1)) \$1 \${X/a/b} ${Y}z \$""#
        );
    }

    fn bash(args: &[&str]) -> std::process::Output {
        std::process::Command::new("bash")
            .args(args)
            .output()
            .unwrap()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        #[test]
        fn quoted_words_reach_bash_unchanged(s in "[^\\x00]{0,24}") {
            let out = bash(&["-c", &format!("printf %s {}", sh_quote(&s))]);
            proptest::prop_assert_eq!(String::from_utf8_lossy(&out.stdout), s);
        }
    }

    /// What bash makes of `dq(s)` with no variable set: each expansion `dq` leaves is empty, or
    /// its default.
    fn unset_value(s: &str) -> String {
        let mut out = String::new();
        let mut i = 0;
        while i < s.len() {
            let rest = &s[i..];
            if let Some(n) = rest.starts_with('$').then(|| expansion_len(rest)).flatten() {
                let e = &rest[..n];
                if let Some(dash) = e.find('-').filter(|_| e.starts_with("${")) {
                    out.push_str(&e[dash + 1..n - 1]);
                }
                i += n;
            } else {
                let c = rest.chars().next().unwrap();
                out.push(c);
                i += c.len_utf8();
            }
        }
        out
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        #[test]
        fn env_values_run_nothing(s in "[ab$(){}:\\-`'\"\\\\ ;|&]{0,16}") {
            let out = std::process::Command::new("env")
                .args(["-i", "bash", "-c", &format!("printf %s {}", dq(&s))])
                .output()
                .unwrap();
            proptest::prop_assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            proptest::prop_assert_eq!(String::from_utf8_lossy(&out.stdout), unset_value(&s));
        }
    }

    fn job(image: Option<&str>) -> Job {
        let r: crate::recipe::Recipe = toml::from_str(&format!(
            "name = \"dbg\"\nnproc_per_node = 1\n{}",
            image
                .map(|i| format!("image = \"{i}\"\n"))
                .unwrap_or_default()
        ))
        .unwrap();
        crate::recipe::resolve(
            &r,
            &crate::recipe::Origin::file("r"),
            Path::new("/w d"),
            "/opt/v/vigil",
            true,
        )
        .unwrap()
    }

    #[test]
    fn attach_sh_is_valid_bash_with_and_without_a_container() {
        let dir = std::env::temp_dir().join(format!("vigil-attach-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for img in [None, Some("/i/x.sqsh")] {
            let t = Target {
                id: "dbg_1",
                dir: Path::new("/e x/dbg_1"),
                recipe: None,
            };
            let text = attach_sh(&job(img), &t, "42");
            assert!(text.contains("job=42\n"));
            assert_eq!(text.contains("--container-image=/i/x.sqsh"), img.is_some());
            let f = dir.join("attach.sh");
            std::fs::write(&f, &text).unwrap();
            let out = bash(&["-n", f.to_str().unwrap()]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn store_job(vigil: &str) -> Job {
        let r: crate::recipe::Recipe = toml::from_str(&format!(
            "name = \"dbg\"\nnproc_per_node = 1\nscript = \"t.py\"\nstore = \"login1:29400\"\nstore_secret_file = \"s e/$(x)'\"\n[vigil]\n{vigil}"
        ))
        .unwrap();
        crate::recipe::resolve(
            &r,
            &crate::recipe::Origin::file("r"),
            Path::new("/w d"),
            "/opt/v/vigil",
            false,
        )
        .unwrap()
    }

    #[test]
    fn a_store_outside_the_job_is_named_and_its_secret_read_at_run_time() {
        let t = Target {
            id: "dbg_1",
            dir: Path::new("/e/dbg_1"),
            recipe: None,
        };
        let text = sbatch(&store_job("max_restarts = 3\n"), &t);
        assert!(
            text.contains("export VIGIL_STORE_SECRET=\"$(cat '/w d/s e/$(x)'\\''')\"\n"),
            "{text}"
        );
        assert!(!text.contains("/dev/urandom"), "{text}");
        assert!(
            text.contains(
                "--master-addr login1 --master-port 29400 --rdzv-conf is_host=false \\\n"
            ),
            "{text}"
        );
        // The `[vigil]` table's rdzv_conf is kept, is_host added, one --rdzv-conf in all.
        let j = store_job("rdzv_conf = \"join_timeout=900\"\n");
        let text = sbatch(&j, &t);
        assert!(
            text.contains("--rdzv-conf join_timeout=900,is_host=false"),
            "{text}"
        );
        assert_eq!(text.matches("--rdzv-conf").count(), 1, "{text}");
        let line = slurm_run_line(&j, Path::new("/e/dbg_1")).words;
        let at = line.iter().position(|w| w == "--master-addr").unwrap();
        assert_eq!(
            line[at..at + 6],
            [
                "--master-addr",
                "login1",
                "--master-port",
                "29400",
                "--rdzv-conf",
                "join_timeout=900,is_host=false"
            ]
        );
        // Without `store`, the allocation draws its own secret as before.
        let mut plain = j.clone();
        plain.store = None;
        let text = sbatch(&plain, &t);
        assert!(text.contains("/dev/urandom") && !text.contains("--master-addr"));
    }

    #[test]
    fn runtimes() {
        assert_eq!(runtime(36000), "10h");
        assert_eq!(runtime(5400), "90m");
        assert_eq!(runtime(61), "61s");
    }

    #[test]
    fn a_vigil_bin_the_container_cannot_see_is_warned_about() {
        let d = Path::new("/home/u/.vigil/experiments");
        let mut j = job(Some("img.sqsh"));
        assert_eq!(unseen_vigil(&j, d), None, "the running binary is mounted");
        j.mount_vigil = false;
        j.vigil_bin = "/opt/v/vigil".into();
        let w = unseen_vigil(&j, d).expect("not mounted, not on PATH");
        assert!(
            w.contains("/opt/v/vigil") && w.contains("docs/install.md"),
            "{w}"
        );
        assert!(w.contains("mounts = [\"/opt/v:/opt/v:ro\"]"), "{w}");
        j.vigil_bin = "/w d/bin/vigil".into();
        assert_eq!(unseen_vigil(&j, d), None, "under the mounted workdir");
        j.vigil_bin = "vigil".into();
        assert_eq!(unseen_vigil(&j, d), None, "the image's PATH");
        let mut j = job(None);
        j.mount_vigil = false;
        assert_eq!(unseen_vigil(&j, d), None, "no container");
    }
}
