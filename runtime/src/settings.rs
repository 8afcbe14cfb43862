//! One grammar for settings: durations are humantime (`200ms`, `5s`, `1m30s`, `6h`) and every
//! flag's environment variable is `HAFLEET_` and its name. The spellings of before (a number
//! of milliseconds or seconds in the flag's name, `--coalesce-ms 200`) are taken for one more
//! release, each with a warning once logging is up ([`Deprecations`]).

use std::time::Duration;

/// Parses a duration flag; a bare number is refused with what to write instead.
pub fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| match text.trim().parse::<u64>() {
        Ok(n) => format!("{n} has no unit: write {n}s, {n}ms or {n}m"),
        Err(_) => format!("{e}: write a duration such as 200ms, 5s, 1m or 6h"),
    })
}

/// A duration flag that took a bare number of seconds before: it still does, for one release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrSeconds {
    pub value: Duration,
    /// Given as a bare number (deprecated).
    pub bare: bool,
}

/// Parses an [`OrSeconds`]: a duration, or (deprecated) a whole number of seconds.
pub fn duration_or_seconds(text: &str) -> Result<OrSeconds, String> {
    match text.trim().parse::<u64>() {
        Ok(n) => Ok(OrSeconds { value: Duration::from_secs(n), bare: true }),
        Err(_) => duration(text).map(|value| OrSeconds { value, bare: false }),
    }
}

/// The deprecated spellings a command line used, to log when logging is up.
#[derive(Debug, Default)]
#[must_use = "log them: Deprecations::log"]
pub struct Deprecations(Vec<String>);

impl Deprecations {
    /// A flag renamed from `old` (a whole number of `unit`) to `new` (a duration): `old`'s
    /// value, given, replaces `new`'s, and is noted.
    pub fn renamed(
        &mut self,
        old: Option<u64>,
        unit: Duration,
        new: &mut Duration,
        (old_flag, new_flag): (&str, &str),
    ) {
        if let Some(n) = old {
            *new = unit.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX));
            self.0.push(format!(
                "--{old_flag} (HAFLEET_{}) is deprecated and goes in the next release: use \
                 --{new_flag} {} (HAFLEET_{})",
                env_name(old_flag),
                humantime::format_duration(*new),
                env_name(new_flag)
            ));
        }
    }

    /// An [`OrSeconds`] flag's value, noted when it was a bare number.
    pub fn seconds(&mut self, given: OrSeconds, flag: &str) -> Duration {
        if given.bare {
            self.0.push(format!(
                "--{flag} {} (HAFLEET_{}) without a unit is deprecated and refused from the \
                 next release: write {}",
                given.value.as_secs(),
                env_name(flag),
                humantime::format_duration(given.value)
            ));
        }
        given.value
    }

    /// A repeatable flag whose environment variable was named apart from it (plural): the
    /// old variable's values, when the new one is not set, and noted.
    pub fn renamed_env<T: Clone>(
        &mut self,
        old: &[T],
        new: &mut Vec<T>,
        (old_env, new_env): (&str, &str),
    ) {
        if !old.is_empty() && new.is_empty() {
            new.extend_from_slice(old);
            self.0.push(format!(
                "{old_env} is deprecated and goes in the next release: set {new_env}"
            ));
        }
    }

    /// What was noted.
    pub fn notes(&self) -> &[String] {
        &self.0
    }

    /// Logs each as a warning.
    pub fn log(self) {
        for note in self.0 {
            tracing::warn!("{note}");
        }
    }
}

/// A flag's name as the tail of its environment variable: upper case, `-` as `_`.
pub fn env_name(flag: &str) -> String {
    flag.to_ascii_uppercase().replace('-', "_")
}

/// Every argument of `command` (and its subcommands) whose environment variable is not
/// `HAFLEET_<LONG>`, as `--long ENV`: empty when the grammar holds. Hidden (deprecated) ones
/// are skipped.
pub fn env_mismatches(command: &clap::Command) -> Vec<String> {
    let mut out = Vec::new();
    for arg in command.get_arguments().filter(|a| !a.is_hide_set()) {
        if let (Some(long), Some(env)) = (arg.get_long(), arg.get_env()) {
            let want = format!("HAFLEET_{}", env_name(long));
            if env.to_str() != Some(want.as_str()) {
                out.push(format!("--{long} {}", env.to_string_lossy()));
            }
        }
        if let Some(long) = arg.get_long()
            && (long.ends_with("-ms") || long.ends_with("-secs") || long.ends_with("-seconds"))
        {
            out.push(format!("--{long} names its unit: take a duration instead"));
        }
    }
    for sub in command.get_subcommands() {
        out.extend(env_mismatches(sub));
    }
    out
}

/// Panics with every [`env_mismatches`] of `command`: each binary's unit test of the grammar.
pub fn assert_grammar(command: &clap::Command) {
    let mismatches = env_mismatches(command);
    assert!(mismatches.is_empty(), "{mismatches:?}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_humantime_and_a_bare_number_says_what_to_write() {
        assert_eq!(duration("200ms"), Ok(Duration::from_millis(200)));
        assert_eq!(duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(duration("0s"), Ok(Duration::ZERO));
        assert_eq!(duration("30").unwrap_err(), "30 has no unit: write 30s, 30ms or 30m");
        assert!(duration("soon").unwrap_err().contains("such as 200ms"));
    }

    #[test]
    fn an_old_spelling_wins_when_given_and_is_noted() {
        let mut d = Deprecations::default();
        let mut coalesce = Duration::from_millis(200);
        d.renamed(None, Duration::from_millis(1), &mut coalesce, ("coalesce-ms", "coalesce"));
        assert_eq!((coalesce, d.notes().len()), (Duration::from_millis(200), 0));
        d.renamed(Some(50), Duration::from_millis(1), &mut coalesce, ("coalesce-ms", "coalesce"));
        assert_eq!(coalesce, Duration::from_millis(50));
        assert_eq!(
            d.notes(),
            ["--coalesce-ms (HAFLEET_COALESCE_MS) is deprecated and goes in the next release: \
              use --coalesce 50ms (HAFLEET_COALESCE)"]
        );
        let mut keys = vec![];
        d.renamed_env(&["a".to_owned()], &mut keys, ("HAFLEET_VERIFY_KEYS", "HAFLEET_VERIFY_KEY"));
        assert_eq!(keys, ["a"]);
        let mut given = vec!["b".to_owned()];
        d.renamed_env(&["a".to_owned()], &mut given, ("HAFLEET_VERIFY_KEYS", "HAFLEET_VERIFY_KEY"));
        assert_eq!(given, ["b"], "the new variable wins");
        let bare = duration_or_seconds("10").unwrap();
        assert_eq!(d.seconds(bare, "ssh-connect-timeout"), Duration::from_secs(10));
        assert!(d.notes().last().unwrap().contains("write 10s"), "{:?}", d.notes());
        let n = d.notes().len();
        let given = duration_or_seconds("1500ms").unwrap();
        assert_eq!(d.seconds(given, "ssh-connect-timeout"), Duration::from_millis(1500));
        assert_eq!(d.notes().len(), n);
    }
}
