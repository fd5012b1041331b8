"""The one command kvtrace runs on a remote host, and the stream it answers with.

The command is a CONSTANT: `sh -c '<fixed script>'`, with no user data in it, so no login
shell (bash, dash, zsh, csh, tcsh, fish) can parse anything of ours differently: it is one line,
single-quoted, with no `!`, newline or backslash-quote in it. Everything else arrives as data on
the channel's stdin, read by the script with `read -r` (the path has been checked for control
characters before connecting, so it is one line):
    <path>\n<max file bytes>\n<max file bytes + 1>\n<enum name>\n<queue names, space-separated>\n
The names are ASCII identifiers (kvtrace.fetch.select.Wanted.searchable) or empty; they only
ever reach `grep -F -e "$e"` as a quoted argument: fixed strings, never code or a pattern.

Round 1 (stdout), every field NUL-terminated:
    KVTRACE3 <pwd -P of the root> <1 if the K/Q/T records below are sent, else empty>
    then records, one per entry `find` met:
        D <dir>            a directory the remote user cannot list or enter (pruned)
        S <ls -lnLd> <f>   a .py file over the per-file limit (not sent)
        U <f>              a .py file the remote user cannot read (not sent)
        R <f>              a .py file that is readable
        L <l> <real>       a symlink (any name) that ends at a folder, and that folder's
                           `pwd -P` (empty if it cannot be entered); never entered by find
        Y <l>              a symlink named *.py that does not end at a folder
        T <n>              bytes of the readable files of one batch of them (find -exec +)
        K <f>... <empty>   which files of that batch hold the enum's name (`grep -l --null -F`)
        Q <f>... <empty>   which files of that batch hold a queue's name
    (K and Q may come before the R records of the files they name: two -exec batches.)
    E
Then the script reads one more line: `all` (every readable .py file and .py symlink, as links,
never followed) or `some` followed by NUL-terminated `./name`s taken from round 1, until the
end of stdin; round 2 is ONE tar archive of those. Nothing is ever written or run on the remote
but find, grep, cat, wc, ls and tar reading the tree, and dd re-blocking round 1's records
(into 64 KiB writes, so the bytes sent do not depend on timing).
A file's fate is known from these records alone: stderr is never parsed (it is localised and
its writes interleave). A name asked for but missing from the archive is reported unreadable.
Exit 3: missing path, 4: cannot enter or read it, 5: not a dir or .py file, 6: no find/tar
(use SFTP), 7: malformed stdin.
"""

from __future__ import annotations

import shlex

MARKER = b"KVTRACE3\0"

_PRUNE = '"(" -type d "(" -name ".*" -o -name __pycache__ ")" -prune ")" -o'
_EACH = "-exec sh -c 'for f; do {body}; done' sh {{}} +"  # inner script in double quotes only
_DIR = _EACH.format(body='[ -r "$f" ] && [ -x "$f" ] || printf "D\\0%s\\0" "$f"')
_BIG = _EACH.format(body='printf "S\\0%s\\0%s\\0" "$(ls -lnLd -- "$f")" "$f"')
_LINK = _EACH.format(body='if [ -d "$f" ]; then printf "L\\0%s\\0%s\\0" "$f" "$(cd -P -- "$f" 2>/dev/null && pwd -P)"; '
                    'else case $f in *.py) printf "Y\\0%s\\0" "$f";; esac; fi')
_READ = _EACH.format(body='if [ -r "$f" ]; then printf "R\\0%s\\0" "$f"; else printf "U\\0%s\\0" "$f"; fi')
# Per batch, when the client asked for it ($g): the batch's bytes and which files hold the names.
_GREP = 'LC_ALL=C grep -l --null -a -F -e'
_HITS = (
    "-exec sh -c '[ -n \"$g\" ] || exit 0; printf \"T\\0%s\\0\" \"$(cat -- \"$@\" 2>/dev/null | wc -c)\"; "
    f'printf \"K\\0\"; {_GREP} \"$e\" -- \"$@\" 2>/dev/null; printf \"\\0\"; '
    f'[ -z \"$q\" ] || {{ printf \"Q\\0\"; {_GREP} \"$q\" -- \"$@\" 2>/dev/null; printf \"\\0\"; }}\' sh {{}} +'
)

SCRIPT = (
    "IFS= read -r r || exit 7; read -r n || exit 7; read -r n1 || exit 7; "
    "IFS= read -r e || exit 7; IFS= read -r qs || exit 7; "
    "command -v find >/dev/null && command -v tar >/dev/null || exit 6; "
    'if [ -d "$r" ]; then cd -- "$r" 2>/dev/null && [ -r . ] || exit 4; s=.; m=1; h=; '
    'elif [ -f "$r" ]; then case $r in *.py) ;; *) exit 5;; esac; '
    'case $r in */*) d=${r%/*}; s=./${r##*/};; *) d=.; s=./$r;; esac; '
    'cd -- "${d:-/}" 2>/dev/null || exit 4; m=0; h=-h; '
    'elif [ -e "$r" ]; then exit 5; else exit 3; fi; '
    # The names are searched for only in a folder, with a grep that has the options used.
    f'g=; [ -n "$e" ] && [ $m = 1 ] && printf "x\\n" | {_GREP} x >/dev/null 2>&1 && g=1; '
    'q=$(printf "%s" "$qs" | tr " " "\\n"); export e q g; '
    "printf 'KVTRACE3\\0%s\\0%s\\0' \"$(pwd -P)\" \"$g\"; "
    # Each record is its own small write; sshd sends what it has read as one SSH packet, so
    # unblocked records cost a packet header each or not depending on how fast sshd wakes (a
    # busy machine changed the bytes sent by a third). dd re-blocks them into 64 KiB writes.
    'b=cat; [ "$(printf x | dd obs=65536 2>/dev/null)" = x ] && b="dd obs=65536"; '
    f'{{ find -H "$s" -mindepth $m {_PRUNE} -type d {_DIR} '
    f'-o -type l {_LINK} '
    f'-o -type f -name "*.py" -size +"$n"c {_BIG} '
    f'-o -type f -name "*.py" {_READ} {_HITS} </dev/null; '
    "printf 'E\\0'; } | $b 2>/dev/null; read -r w || exit 7; "
    'case $w in some) tar --null --no-recursion -T - -cf - ;; '
    f'all) find -H "$s" -mindepth $m {_PRUNE} "(" -type l -o -type f -size -"$n1"c ")" -name "*.py" '
    "-print0 </dev/null | tar $h --null --no-recursion -T - -cf - ;; *) exit 7;; esac"
)

COMMAND = "sh -c " + shlex.quote(SCRIPT)


def stdin_payload(path: str, max_file_bytes: int, enum: str = "", queues: tuple[str, ...] = ()) -> bytes:
    """What the script reads first: the path, the limit and the names to search for, one per
    line (the path has no newline; the names are identifiers, or empty: search for nothing)."""
    assert path.isprintable(), "control characters are refused before connecting"
    assert all(name.isidentifier() and name.isascii() for name in (*queues, *([enum] if enum else []))), "searchable names only"
    return f"{path}\n{max_file_bytes}\n{max_file_bytes + 1}\n{enum}\n{' '.join(queues)}\n".encode("utf-8", "surrogateescape")


def request_all() -> bytes:
    """Round 2: every readable .py file (the whole tree, as before names were searched for)."""
    return b"all\n"


def request_some(names: list[bytes]) -> bytes:
    """Round 2: these names, as round 1 gave them (`./...`: never read as a tar option)."""
    assert all(name.startswith(b"./") and b"\0" not in name for name in names)
    return b"some\n" + b"".join(name + b"\0" for name in names)
