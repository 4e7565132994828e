//! Tool-name globs: `*` matches any run of characters (none included), `?`
//! exactly one character, every other character itself (`[`, `\` and `{` are
//! not special). A glob matches the whole name, case-sensitively, character
//! by character (Unicode scalar values of the decoded UTF-8 name). Pure.

/// One compiled glob: the pattern cut at each `*` into segments (which may
/// hold `?`). The first segment is anchored at the start of the name, the
/// last at its end, and those between are found leftmost-first in order:
/// a `*` can absorb whatever lies between two segments, so the leftmost
/// place of each is always as good as any later one. So each segment is
/// searched once, never backtracked into: without `?` a search is
/// `str::find` (two-way, linear time); a segment holding `?` is tried at
/// each position, at most `name × segment` steps. Linear in the name (the
/// server's) for a given pattern (the operator's), never the exponential
/// time of a backtracking matcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Glob {
    pattern: Box<str>,
    /// The text between stars; one segment when there is no `*`.
    segments: Box<[Segment]>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Segment {
    text: Box<str>,
    /// Holds a `?`.
    any: bool,
    /// Length in characters, which is also what it matches.
    chars: usize,
}

impl Glob {
    /// Every string is a glob; nothing to refuse.
    pub fn new(pattern: &str) -> Glob {
        let segments = pattern
            .split('*')
            .map(|t| Segment { text: t.into(), any: t.contains('?'), chars: t.chars().count() })
            .collect();
        Glob { pattern: pattern.into(), segments }
    }

    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// Whether the glob matches the whole of `name`.
    pub fn matches(&self, name: &str) -> bool {
        let (first, rest) = match &*self.segments {
            [only] => return only.matches_exactly(name),
            [first, rest @ ..] => (first, rest),
            [] => return name.is_empty(),
        };
        let Some((last, middle)) = rest.split_last() else {
            return false;
        };
        let Some(mut from) = first.match_at(name, 0) else {
            return false;
        };
        // Where the last segment must start: its length back from the end
        // (in characters when it holds `?`).
        let tail = if last.any {
            start_of_last_chars(name, last.chars)
        } else {
            name.len().checked_sub(last.text.len())
        };
        let Some(tail) = tail else {
            return false;
        };
        if tail < from || last.match_at(name, tail) != Some(name.len()) {
            return false;
        }
        let Some(region) = name.get(..tail) else {
            return false;
        };
        for seg in middle {
            match seg.find(region, from) {
                Some(end) => from = end,
                None => return false,
            }
        }
        true
    }
}

impl Segment {
    fn matches_exactly(&self, name: &str) -> bool {
        if self.any {
            self.match_at(name, 0) == Some(name.len())
        } else {
            *self.text == *name
        }
    }

    /// The end of the match when the segment matches `s` at byte `at`.
    fn match_at(&self, s: &str, at: usize) -> Option<usize> {
        let rest = s.get(at..)?;
        if !self.any {
            return rest.starts_with(&*self.text).then_some(at + self.text.len());
        }
        let mut names = rest.chars();
        let mut end = at;
        for c in self.text.chars() {
            let d = names.next()?;
            if c != '?' && c != d {
                return None;
            }
            end += d.len_utf8();
        }
        Some(end)
    }

    /// The end of the leftmost match in `s` at or after byte `from`.
    fn find(&self, s: &str, from: usize) -> Option<usize> {
        let rest = s.get(from..)?;
        if !self.any {
            return rest.find(&*self.text).map(|i| from + i + self.text.len());
        }
        rest.char_indices()
            .map(|(i, _)| from + i)
            .chain(std::iter::once(s.len()))
            .find_map(|at| self.match_at(s, at))
    }
}

/// The byte offset `n` characters before the end of `s`.
fn start_of_last_chars(s: &str, n: usize) -> Option<usize> {
    if n == 0 {
        return Some(s.len());
    }
    s.char_indices().rev().nth(n - 1).map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::Rng;

    /// Obviously right and exponential: tries every split at each `*`.
    fn naive(p: &[char], n: &[char]) -> bool {
        match p.split_first() {
            None => n.is_empty(),
            Some(('*', rest)) => (0..=n.len()).any(|i| naive(rest, &n[i..])),
            Some(('?', rest)) => !n.is_empty() && naive(rest, &n[1..]),
            Some((c, rest)) => n.first() == Some(c) && naive(rest, &n[1..]),
        }
    }

    #[test]
    fn table() {
        let cases: &[(&str, &str, bool)] = &[
            ("chat_send", "chat_send", true),
            ("chat_send", "chat_sen", false),
            ("chat_send", "chat_sendx", false),
            ("chat_*", "chat_send", true),
            ("chat_*", "chat_", true),
            ("chat_*", "chat", false),
            ("*", "", true),
            ("*", "anything", true),
            ("", "", true),
            ("", "a", false),
            ("?", "", false),
            ("?", "é", true),
            ("?", "😀", true),
            ("??", "😀", false),
            ("chat_?ead", "chat_read", true),
            ("chat_?ead", "chat_rread", false),
            ("*_rules", "chat_rules", true),
            ("*_rules", "chat_rules_v2", false),
            ("*rules*", "chat_rules_v2", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXbYcZ", false),
            ("a*b*c", "abbbc", true),
            ("a*a*a*b", "aaaaaaaaaaaaaaaaaaaa", false),
            ("**", "x", true),
            ("*?", "", false),
            ("*?", "x", true),
            ("[ab]", "[ab]", true),
            ("[ab]", "a", false),
            ("a\\*", "a\\xyz", true),
            ("Chat_*", "chat_send", false),
            ("é*", "éa", true),
        ];
        for &(p, n, want) in cases {
            assert_eq!(Glob::new(p).matches(n), want, "{p:?} vs {n:?}");
        }
    }

    #[test]
    fn agrees_with_the_naive_matcher() {
        let mut r = Rng(0x5DEE_CE66_D1CE_4E5B);
        let pat_chars = ['a', 'b', 'é', '*', '?', '*'];
        let name_chars = ['a', 'b', 'é'];
        for _ in 0..100_000 {
            let p: Vec<char> = (0..r.below(8)).map(|_| r.pick(&pat_chars)).collect();
            let n: Vec<char> = (0..r.below(9)).map(|_| r.pick(&name_chars)).collect();
            let (ps, ns): (String, String) = (p.iter().collect(), n.iter().collect());
            assert_eq!(Glob::new(&ps).matches(&ns), naive(&p, &n), "{ps:?} vs {ns:?}");
        }
    }

    #[test]
    fn hostile_patterns_stay_fast() {
        // Exponential for a backtracking matcher. The name is the server's
        // (any length); the pattern is the operator's.
        let name = format!("{}b", "a".repeat(100_000));
        let t = std::time::Instant::now();
        for (pattern, want) in [
            (format!("{}b", "*a".repeat(50)), true),
            (format!("{}c", "*a".repeat(50)), false),
            (format!("{}*b", "*a?".repeat(50)), true),
            (format!("{}*", "*a?b".repeat(20)), false),
            (format!("*{}*", "?".repeat(200)), true),
            (format!("*{}c*", "?".repeat(200)), false),
            (format!("{}*", "?".repeat(100_001)), true),
            ("?".repeat(100_002), false),
        ] {
            assert_eq!(Glob::new(&pattern).matches(&name), want, "{}", &pattern[..20]);
        }
        // A gross bound: a backtracking matcher takes years, and a loaded CI
        // machine runs a debug build of this in seconds.
        assert!(t.elapsed() < std::time::Duration::from_secs(20), "{:?}", t.elapsed());
    }
}
