//! Every file vigil reads goes through here (docs/security.md): the file must be a regular
//! file, checked on the opened descriptor (a FIFO is opened without blocking, so one with no
//! writer cannot hang the reader; `/dev/zero` and other devices are refused), and what is read
//! is bounded: a small file (a recipe, a config, a sysfs counter) by its whole size, a
//! line-oriented log (events, ledgers) by each line's length, read streaming.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why a file was not read. Its text names the path and the problem, without a fix: the caller
/// knows which flag or file it was and adds the fix.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is {kind}, not a regular file")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{path} is larger than {limit} bytes")]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("{path}: line {line} is longer than {limit} bytes")]
    LineTooLong {
        path: PathBuf,
        line: usize,
        limit: usize,
    },
}

impl ReadError {
    /// The file does not exist (as opposed to existing and being refused).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ReadError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }

    /// What is wrong, without the path, for a caller whose message names the file already.
    pub fn reason(&self) -> String {
        match self {
            ReadError::Io { source, .. } => source.to_string(),
            ReadError::NotRegular { kind, .. } => format!("it is {kind}, not a regular file"),
            ReadError::TooLarge { limit, .. } => format!("it is larger than {limit} bytes"),
            ReadError::LineTooLong { line, limit, .. } => {
                format!("its line {line} is longer than {limit} bytes")
            }
        }
    }

    /// As an `std::io::Error` of the same kind (NotFound stays NotFound), whose text is
    /// [`ReadError::reason`].
    pub fn into_io(self) -> std::io::Error {
        match self {
            ReadError::Io { source, .. } => source,
            other => std::io::Error::new(std::io::ErrorKind::InvalidData, other.reason()),
        }
    }
}

/// What kind of file a non-regular file is, in words.
fn kind(ft: std::fs::FileType) -> &'static str {
    if ft.is_fifo() {
        "a FIFO (named pipe)"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_dir() {
        "a directory"
    } else {
        "not a plain file"
    }
}

/// Opens `path` for reading if it is a regular file (symbolic links followed). The open does
/// not block on a FIFO (O_NONBLOCK), and the type is checked on the opened descriptor, so the
/// file checked is the file read.
pub fn open_regular(path: &Path) -> Result<File, ReadError> {
    let io = |source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(io)?;
    let ft = f.metadata().map_err(io)?.file_type();
    if !ft.is_file() {
        return Err(ReadError::NotRegular {
            path: path.to_path_buf(),
            kind: kind(ft),
        });
    }
    Ok(f)
}

/// The whole of a small regular file, at most `limit` bytes. A larger one is refused after
/// reading at most `limit + 1` bytes (by reading, not from stat: sysfs and procfs files say
/// size 4096 or 0 whatever they hold).
pub fn read_bytes(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let f = open_regular(path)?;
    let too_large = || ReadError::TooLarge {
        path: path.to_path_buf(),
        limit,
    };
    let mut buf = Vec::new();
    f.take(limit + 1)
        .read_to_end(&mut buf)
        .map_err(|source| ReadError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    if buf.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(buf)
}

/// [`read_bytes`] as text; bytes that are not UTF-8 become U+FFFD.
pub fn read_string(path: &Path, limit: u64) -> Result<String, ReadError> {
    read_bytes(path, limit).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// A sysfs or procfs value (`/sys/class/infiniband/*/ports/*/counters/*`), trimmed; `None`
/// when it cannot be read, is not a regular file or is longer than a counter can be.
pub fn read_sysfs(path: &Path) -> Option<String> {
    read_string(path, SYSFS_LIMIT)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The most a sysfs attribute holds (one page).
pub const SYSFS_LIMIT: u64 = 4096;
/// The most a small configuration file (recipe, ft_launcher YAML, experiment record) may be.
pub const CONFIG_LIMIT: u64 = 1 << 20;
/// The most one line of an event log or a ledger may be.
pub const LINE_LIMIT: usize = 1 << 20;

/// One line of a line-oriented file: its bytes without the newline, and whether the newline was
/// there (a last line without one was cut short by a crash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub number: usize,
    pub text: String,
    pub complete: bool,
}

/// Reads a regular file line by line, each line at most `limit` bytes: memory stays one line
/// whatever the file's size. A longer line ends the reading with [`ReadError::LineTooLong`]
/// (vigil's own records are short lines: one that long is not one of them).
pub struct Lines {
    path: PathBuf,
    reader: BufReader<File>,
    limit: usize,
    number: usize,
    done: bool,
}

/// Opens a line-oriented file for [`Lines`].
pub fn lines(path: &Path, limit: usize) -> Result<Lines, ReadError> {
    Ok(Lines {
        path: path.to_path_buf(),
        reader: BufReader::with_capacity(64 * 1024, open_regular(path)?),
        limit,
        number: 0,
        done: false,
    })
}

impl Lines {
    fn next_line(&mut self) -> Result<Option<Line>, ReadError> {
        let mut buf = Vec::new();
        let cap = self.limit as u64 + 1;
        let n = (&mut self.reader)
            .take(cap)
            .read_until(b'\n', &mut buf)
            .map_err(|source| ReadError::Io {
                path: self.path.clone(),
                source,
            })?;
        if n == 0 {
            return Ok(None);
        }
        self.number += 1;
        let complete = buf.last() == Some(&b'\n');
        if complete {
            buf.pop();
        }
        if buf.len() > self.limit {
            return Err(ReadError::LineTooLong {
                path: self.path.clone(),
                line: self.number,
                limit: self.limit,
            });
        }
        Ok(Some(Line {
            number: self.number,
            text: String::from_utf8_lossy(&buf).into_owned(),
            complete,
        }))
    }
}

impl Iterator for Lines {
    type Item = Result<Line, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let r = self.next_line().transpose();
        if !matches!(r, Some(Ok(_))) {
            self.done = true;
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vigil-bounded-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn devices_and_fifos_are_refused_without_blocking() {
        let e = read_bytes(Path::new("/dev/zero"), 10).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        let d = dir("fifo");
        let fifo = d.join("f");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads the NUL-terminated path it is given.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_bytes(&fifo, 10).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
        assert!(lines(&fifo, 10).is_err());
        let e = read_bytes(&d, 10).unwrap_err();
        assert!(e.to_string().contains("directory"), "{e}");
        assert!(read_bytes(&d.join("absent"), 10)
            .unwrap_err()
            .is_not_found());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn errors_keep_their_kind_and_say_why_without_the_path() {
        let e = read_bytes(Path::new("/nonexistent/vigil-bounded"), 1).unwrap_err();
        assert!(e.is_not_found());
        assert_eq!(e.into_io().kind(), std::io::ErrorKind::NotFound);
        let e = read_bytes(Path::new("/dev/null"), 1).unwrap_err();
        assert_eq!(e.reason(), "it is a character device, not a regular file");
        assert!(e.to_string().starts_with("/dev/null is a character device"));
        let io = e.into_io();
        assert_eq!(io.kind(), std::io::ErrorKind::InvalidData);
        assert_eq!(
            io.to_string(),
            "it is a character device, not a regular file"
        );
    }

    #[test]
    fn sizes_are_bounded() {
        let d = dir("size");
        let f = d.join("f");
        std::fs::write(&f, b"0123456789").unwrap();
        assert_eq!(read_bytes(&f, 10).unwrap(), b"0123456789");
        let e = read_bytes(&f, 9).unwrap_err();
        assert!(matches!(e, ReadError::TooLarge { limit: 9, .. }), "{e}");
        // A sparse file of 1 TB is refused after reading a little more than the limit.
        let big = d.join("big");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        assert!(matches!(
            read_bytes(&big, 1 << 20),
            Err(ReadError::TooLarge { .. })
        ));
        assert!(matches!(
            lines(&big, 1024).unwrap().next(),
            Some(Err(ReadError::LineTooLong { line: 1, .. }))
        ));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn lines_stream_with_a_cap_each() {
        let d = dir("lines");
        let f = d.join("l");
        let mut w = std::fs::File::create(&f).unwrap();
        w.write_all(b"a\n\nbcd\nlast").unwrap();
        let got: Vec<Line> = lines(&f, 4).unwrap().map(Result::unwrap).collect();
        let want: Vec<(usize, &str, bool)> = vec![
            (1, "a", true),
            (2, "", true),
            (3, "bcd", true),
            (4, "last", false),
        ];
        assert_eq!(
            got.iter()
                .map(|l| (l.number, l.text.as_str(), l.complete))
                .collect::<Vec<_>>(),
            want
        );
        let r: Vec<_> = lines(&f, 2).unwrap().collect();
        assert!(matches!(
            r.last(),
            Some(Err(ReadError::LineTooLong { line: 3, .. }))
        ));
        assert_eq!(r.len(), 3);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
