//! `lb agent --override-file`: what an operator writes to take a backend out by hand (`drain`,
//! `down`, `50%`). The agent answers anyone who connects, so the file is read with care: never
//! through a symbolic link (which could point at a file only root may read), only a regular file
//! (a FIFO would hang the agent in `open`, a device like /dev/zero fill its memory), at most
//! [`MAX`] octets, and what is answered is the line as lb reads it, written anew (`drain 50%`),
//! never the file's own text: a line lb would call garbage is refused, not echoed.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use lb::load::{parse, State};

/// The most of the file that is read: an agent line is at most 4096 octets (docs/load.md).
pub const MAX: u64 = 4096;

/// What the override file says now.
#[derive(Debug, PartialEq, Eq)]
pub enum Override {
    /// No file: the measure is answered.
    Absent,
    /// The answer, as lb reads the file's first line.
    Answer(String),
    /// The file is there but is not answered, and why (the measure is answered meanwhile).
    Refused(String),
}

/// Reads the override file at `path`.
pub fn read(path: &Path) -> Override {
    // O_NOFOLLOW: a symbolic link fails (ELOOP); O_NONBLOCK: a FIFO opens at once, with no
    // writer, instead of waiting for one; O_NOCTTY: a terminal does not become the agent's.
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY).open(path);
    let file = match file {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Override::Absent,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Override::Refused("it is a symbolic link".to_string()),
        Err(e) => return Override::Refused(format!("opening it: {e}")),
    };
    match file.metadata() {
        Ok(m) if m.is_file() => {}
        Ok(m) => return Override::Refused(format!("it is not a regular file ({:?})", m.file_type())),
        Err(e) => return Override::Refused(format!("reading its metadata: {e}")),
    }
    let mut text = Vec::new();
    if let Err(e) = file.take(MAX + 1).read_to_end(&mut text) {
        return Override::Refused(format!("reading it: {e}"));
    }
    let first = text.split(|&b| b == b'\n').next().unwrap_or_default();
    if first.len() as u64 > MAX {
        return Override::Refused(format!("its first line is longer than {MAX} octets"));
    }
    let Ok(line) = std::str::from_utf8(first) else {
        return Override::Refused("its first line is not UTF-8 text".to_string());
    };
    match parse(line.trim_end_matches('\r')) {
        Ok(report) => {
            let state = report.state.map(|s| match s {
                State::Ready => "ready",
                State::Drain => "drain",
                State::Down => "down",
            });
            let capacity = report.capacity.map(|c| format!("{c}%"));
            Override::Answer([state.map(str::to_string), capacity].into_iter().flatten().collect::<Vec<_>>().join(" "))
        }
        // Not why (parse quotes the words it could not read): nothing of the file is repeated.
        Err(_) => Override::Refused("its first line is not an agent answer (`drain`, `down`, `50%`, ...)".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("lb-override-{}-{:?}", std::process::id(), std::thread::current().id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }

    #[test]
    fn an_answer_is_read_as_lb_reads_it_and_written_anew() {
        let d = dir();
        let f = d.join("override");
        assert_eq!(read(&f), Override::Absent);
        for (text, answer) in [
            ("drain\n", "drain"),
            ("down", "down"),
            ("50%\nsecond line, never read\n", "50%"),
            ("DRAIN 20%  # an operator's note\n", "drain 20%"),
            ("ready maxconn:30 75%\r\n", "ready 75%"),
        ] {
            std::fs::write(&f, text).expect("write");
            assert_eq!(read(&f), Override::Answer(answer.to_string()), "{text:?}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn what_is_not_an_answer_or_not_a_plain_file_is_refused_and_never_echoed() {
        let d = dir();
        let secret = d.join("secret");
        std::fs::write(&secret, "drain # root:$6$a-hash-that-must-not-leak\n").expect("write");
        let link = d.join("link");
        std::os::unix::fs::symlink(&secret, &link).expect("symlink");
        assert_eq!(read(&link), Override::Refused("it is a symbolic link".to_string()));

        let garbage = d.join("garbage");
        std::fs::write(&garbage, "root:x:0:0:root:/root:/bin/bash\n").expect("write");
        assert!(matches!(read(&garbage), Override::Refused(w) if !w.contains("root:x")), "garbage is not echoed, not even in the refusal");

        let long = d.join("long");
        std::fs::write(&long, "5".repeat(MAX as usize + 10)).expect("write");
        assert!(matches!(read(&long), Override::Refused(w) if w.contains("longer")));

        // A FIFO with no writer: open would wait for one without O_NONBLOCK.
        let fifo = d.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR).expect("mkfifo");
        let started = std::time::Instant::now();
        assert!(matches!(read(&fifo), Override::Refused(w) if w.contains("not a regular file")));
        assert!(started.elapsed() < std::time::Duration::from_secs(1), "a FIFO hung the read");

        // A device that never ends: refused before a byte is read.
        assert!(matches!(read(Path::new("/dev/zero")), Override::Refused(w) if w.contains("not a regular file")));
        // A directory.
        assert!(matches!(read(&d), Override::Refused(_)));
        let _ = std::fs::remove_dir_all(&d);
    }
}
