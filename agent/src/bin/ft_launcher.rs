//! `ft_launcher`: NVRx's launcher name for installs that cannot make a symlink (a wheel's scripts
//! directory). It replaces itself with the `vigil` binary beside it, under the name `ft_launcher`,
//! which makes that binary `vigil run` with ft_launcher's flags; a symlink named `ft_launcher`
//! to `vigil` does the same.
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let me = std::env::current_exe();
    let Some(vigil) = me.as_ref().ok().map(|p| p.with_file_name("vigil")) else {
        eprintln!("ft_launcher: cannot find where this program lives; run `vigil run` instead");
        return vigil::exit::code(vigil::exit::NOT_FOUND);
    };
    let err = Command::new(&vigil)
        .arg0("ft_launcher")
        .args(std::env::args_os().skip(1))
        .exec();
    eprintln!(
        "ft_launcher: cannot run {} ({err}): the vigil binary belongs beside ft_launcher; reinstall with `pip install vigil-train`",
        vigil.display()
    );
    vigil::exit::code(vigil::exit::NOT_FOUND)
}
