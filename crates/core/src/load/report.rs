//! The agent line: what a backend's agent answers when lb asks for its load (docs/load.md).
//! One line, read the way HAProxy's agent-check reads it, with one difference: each answer is
//! the whole truth, so a line without `drain` or `down` means ready.

/// What an agent may say, one line: `75%` (capacity left), `ready`, `drain`, `down`, or a state
/// and a capacity together (`ready 75%`), as HAProxy's agent-check reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    pub state: Option<State>,
    /// Capacity left, 0 to 100.
    pub capacity: Option<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Ready,
    Drain,
    Down,
}

impl Report {
    /// The report as an agent line that [`parse`] reads back as the same report: how a node
    /// publishes what its agent said (src/fleet/view.rs).
    pub fn text(&self) -> String {
        let state = self.state.map(|s| match s {
            State::Ready => "ready",
            State::Drain => "drain",
            State::Down => "down",
        });
        match (state, self.capacity) {
            (Some(s), Some(c)) => format!("{s} {c}%"),
            (Some(s), None) => s.to_string(),
            (None, Some(c)) => format!("{c}%"),
            (None, None) => "ready".to_string(),
        }
    }
}

/// Reads one agent line; an error says what was wrong with it (and the caller counts it and keeps
/// the last good report).
pub fn parse(line: &str) -> Result<Report, String> {
    let mut report = Report { state: None, capacity: None };
    // As HAProxy reads it: `#` starts a comment, and `maxconn:N` (which lb has no use for) is
    // skipped.
    let line = line.split('#').next().unwrap_or_default();
    let words: Vec<&str> = line
        .split(|c: char| c.is_ascii_whitespace() || c == ',')
        .filter(|w| !w.is_empty() && !w.to_ascii_lowercase().starts_with("maxconn:"))
        .collect();
    if words.is_empty() {
        return Err("an empty line".to_string());
    }
    for w in words {
        let lower = w.to_ascii_lowercase();
        if let Some(n) = lower.strip_suffix('%') {
            let v: u32 = n.parse().map_err(|_| format!("{w:?} is not a percentage"))?;
            if v > 100 {
                return Err(format!("{w:?} is over 100%"));
            }
            if report.capacity.replace(v as u8).is_some() {
                return Err("two capacities in one line".to_string());
            }
            continue;
        }
        let state = match lower.as_str() {
            "ready" | "up" => State::Ready,
            "drain" => State::Drain,
            "down" | "maint" | "stopped" | "fail" => State::Down,
            _ => return Err(format!("{w:?} is neither a capacity nor ready, drain or down")),
        };
        if report.state.replace(state).is_some() {
            return Err("two states in one line".to_string());
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_lines_parse_as_haproxy_reads_them() {
        assert_eq!(parse("75%").unwrap(), Report { state: None, capacity: Some(75) });
        assert_eq!(parse("ready 40%\n").unwrap(), Report { state: Some(State::Ready), capacity: Some(40) });
        assert_eq!(parse("DRAIN").unwrap().state, Some(State::Drain));
        assert_eq!(parse("down").unwrap().state, Some(State::Down));
        assert_eq!(parse("up 60% maxconn:30 # busy").unwrap(), Report { state: Some(State::Ready), capacity: Some(60) });
        for line in ["75%", "ready 40%", "drain", "down 10%", "ready"] {
            let r = parse(line).unwrap();
            assert_eq!(parse(&r.text()).unwrap(), r, "{line}");
        }
        for bad in ["", "  ", "101%", "-3%", "x%", "fast", "50% 60%", "ready drain"] {
            assert!(parse(bad).is_err(), "{bad:?} must be refused");
        }
    }
}
