//! The shell syntax errors a tokenizer can see in one task line, found when the file is checked
//! rather than when the task runs (and fails, and is retried): quotes, `$(`, `${`, backquotes
//! and parentheses left open, and a line that ends in a backslash as if it went on. It follows
//! POSIX sh's quoting rules and reports only what `/bin/sh -c` would refuse too (or, for the
//! trailing backslash, what almost surely meant a continuation line); a line that closes
//! everything it opens is accepted whatever else it holds.

/// What is open at a point of the line, innermost last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    /// `(`: a subshell, or a parenthesis inside `$(`.
    Paren,
    /// `$(` (and `$((`, whose inner `(` is a `Paren`).
    Subst,
    /// `${`.
    Param,
    /// `"`.
    Double,
}

impl Open {
    fn unclosed(self) -> &'static str {
        match self {
            Open::Paren => "'(' is not closed by ')'",
            Open::Subst => "'$(' is not closed by ')'",
            Open::Param => "'${' is not closed by '}'",
            Open::Double => "double quote '\"' is not closed",
        }
    }
}

/// How a `${` goes on.
enum Param {
    /// `${name}`: the index of its `}`.
    Closed(usize),
    /// A bad substitution, which the shell refuses only when it runs; how it reads on from there
    /// is its own business, so the rest of the line is not judged.
    Bad,
    /// `${name` and an operator (`:-`, `#`, …) at this index: a word follows that nests quotes
    /// and substitutions, up to its `}`.
    Word(usize),
    Unclosed,
}

fn param(cmd: &[u8], dollar: usize) -> Param {
    let name = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut j = dollar + 2;
    if cmd.get(j) == Some(&b'#') && cmd.get(j + 1).is_some_and(|&c| name(c)) {
        j += 1;
    }
    let start = j;
    match cmd.get(j) {
        Some(c) if c.is_ascii_alphabetic() || *c == b'_' => {
            while cmd.get(j).is_some_and(|&c| name(c)) {
                j += 1;
            }
        }
        Some(c) if c.is_ascii_digit() => {
            while cmd.get(j).is_some_and(u8::is_ascii_digit) {
                j += 1;
            }
        }
        Some(c) if b"#?$!*@-".contains(c) => j += 1,
        _ => {}
    }
    match cmd.get(j) {
        Some(b'}') if j > start => Param::Closed(j),
        Some(c) if j > start && b":-=?+#%".contains(c) => Param::Word(j),
        _ if cmd[dollar + 2..].contains(&b'}') => Param::Bad,
        _ => Param::Unclosed,
    }
}

fn closing_backquote(cmd: &[u8], open: usize) -> Option<usize> {
    let mut j = open + 1;
    while j < cmd.len() {
        match cmd[j] {
            b'\\' => j += 2,
            b'`' => return Some(j),
            _ => j += 1,
        }
    }
    None
}

/// Checks one command; on error, the 0-based offset of what was left open (or of the trailing
/// backslash) and why.
pub fn check(cmd: &[u8]) -> Result<(), (usize, &'static str)> {
    let mut open: Vec<(Open, usize)> = Vec::new();
    // Whether the byte before `i` belongs to a word (an escaped `(` does): `#` starts a comment
    // only where a word may start.
    let mut in_word = false;
    let mut i = 0;
    while i < cmd.len() {
        let b = cmd[i];
        let was_in_word = in_word;
        in_word = !matches!(b, b' ' | b'\t' | b';' | b'&' | b'|' | b'(' | b')' | b'<' | b'>');
        let top = open.last().map(|o| o.0);
        let quoted = top == Some(Open::Double);
        match b {
            b'\\' => {
                if i + 1 == cmd.len() {
                    return Err((i, "the line ends with a backslash (a task is one line; lines do not continue)"));
                }
                i += 2;
                continue;
            }
            b'\'' if !quoted => match cmd[i + 1..].iter().position(|&c| c == b'\'') {
                Some(n) => i += n + 1,
                None => return Err((i, "single quote ' is not closed")),
            },
            b'"' if quoted => {
                open.pop();
            }
            b'"' => open.push((Open::Double, i)),
            // The shell reads a backquoted command as text up to the next unescaped backquote
            // and parses it only when it runs: nothing inside nests.
            b'`' => match closing_backquote(cmd, i) {
                Some(end) => i = end,
                None => return Err((i, "backquote '`' is not closed")),
            },
            b'$' if cmd.get(i + 1) == Some(&b'(') => {
                open.push((Open::Subst, i));
                i += 1;
            }
            b'$' if cmd.get(i + 1) == Some(&b'{') => match param(cmd, i) {
                Param::Closed(end) => i = end,
                Param::Bad => return Ok(()),
                Param::Word(op) => {
                    open.push((Open::Param, i));
                    i = op;
                }
                Param::Unclosed => return Err((i, Open::Param.unclosed())),
            },
            b'}' if top == Some(Open::Param) => {
                open.pop();
            }
            _ if quoted || top == Some(Open::Param) => {}
            b'(' => open.push((Open::Paren, i)),
            // An unmatched `)` is left to the shell: `case` patterns close what nothing opened.
            b')' if matches!(top, Some(Open::Paren | Open::Subst)) => {
                open.pop();
            }
            b'#' if !was_in_word => {
                // A comment runs to the end of the line, and swallows whatever would close.
                break;
            }
            _ => {}
        }
        i += 1;
    }
    match open.first() {
        Some(&(what, at)) => Err((at, what.unclosed())),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) {
        assert_eq!(check(s.as_bytes()), Ok(()), "{s}");
    }
    fn bad(s: &str, at: usize, why: &str) {
        let e = check(s.as_bytes()).expect_err(s);
        assert_eq!(e.0, at, "{s}: {e:?}");
        assert!(e.1.contains(why), "{s}: {e:?}");
    }

    #[test]
    fn lines_that_close_what_they_open_are_accepted() {
        for s in [
            r#"echo "a'b""#,
            r"echo \$\(",
            "echo a#b # c (",
            "echo '$(' \"\\`\"",
            "x=$(echo $((1 + (2 * 3))))",
            "echo ${HOME:-$(pwd)} \"${x}\"",
            "echo `date` \"`date`\"",
            "(cd /tmp && ls) | wc -l",
            "case a in a) echo ok;; esac",
            r#"echo "a \" b" 'c\'"#,
            "echo \"$(echo \"inner\")\"",
            "echo # a comment with ' and (",
            "",
        ] {
            ok(s);
        }
    }

    #[test]
    fn what_is_left_open_is_named_at_its_place() {
        bad("echo 'abc", 5, "single quote");
        bad("echo \"abc", 5, "double quote");
        bad("echo $(date", 5, "'$('");
        bad("echo \"$(date\"", 5, "double quote");
        bad("echo `date", 5, "backquote");
        bad("(cd /tmp", 0, "'('");
        bad("echo ${HOME", 5, "'${'");
        bad("echo a \\", 7, "backslash");
        bad(r"echo \$(", 7, "'('");
        bad("echo $(echo a # b)", 5, "'$('");
        bad("echo '$(' \"`\"", 11, "backquote");
        ok("echo ${${'\"} '} $(\\(#)");
        bad("echo ${`a", 5, "'${'");
        ok("echo ${`a};## ${(} ${x:-\"}\"} ${x:-`echo }`} ${a\"a} ${#x} ${10} ${#}");
        bad("echo ${#x", 5, "'${'");
        bad("echo ${x:-$(echo a}", 5, "'${'");
        ok("echo `) ${` ;`\\\\(` \\``#\"'$(`");
    }

    /// Random lines of quoting characters: whatever this refuses, `/bin/sh -n` refuses too (but
    /// for a trailing backslash, which sh takes literally and a task file takes for a mistake).
    #[test]
    fn nothing_is_refused_that_the_shell_accepts() {
        let alphabet = [&b"'"[..], b"\"", b"`", b"$(", b"${", b"(", b")", b"}", b"#", b" ", b"a", b"\\", b";"];
        let mut next = crate::test_rng(0x5eed_cafe);
        let mut refused = 0;
        for _ in 0..400 {
            let mut line = b"echo ".to_vec();
            for _ in 0..1 + next(8) {
                line.extend_from_slice(alphabet[next(alphabet.len() as u64) as usize]);
            }
            let Err((_, why)) = check(&line) else { continue };
            if line.ends_with(b"\\") {
                continue;
            }
            refused += 1;
            let text = String::from_utf8(line).unwrap();
            let sh = std::process::Command::new("/bin/sh").args(["-n", "-c", &text]).output().unwrap();
            assert!(!sh.status.success(), "refused ({why}) but sh -n accepts: {text}");
        }
        assert!(refused > 50, "only {refused} lines refused: the alphabet no longer tests much");
    }
}
