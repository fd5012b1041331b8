"""The one command kvtrace runs on a remote host, and the stream it answers with.

The command is a CONSTANT: `sh -c '<fixed script>'`, with no user data in it, so no login
shell (bash, dash, zsh, csh, tcsh, fish) can parse anything of ours differently: it is one line,
single-quoted, with no `!`, newline or backslash-quote in it. The remote path and the size limit
arrive as lines on the channel's stdin and are read by the script with `read -r`; the path has
been checked for control characters (so it is one line) before connecting.

Stream (stdout), every field NUL-terminated:
    KVTRACE2 <pwd -P of the root>
    then records, one per entry `find` met:
        D <dir>            a directory the remote user cannot list or enter (pruned)
        S <ls -lnLd> <f>   a .py file over the per-file limit (not sent)
        U <f>              a .py file the remote user cannot read (not sent)
        R <f>              a .py file that is readable: it must be in the archive
        L <l> <real>       a symlink (any name) that ends at a folder, and that folder's
                           `pwd -P` (empty if it cannot be entered); never entered by find
    E
    then ONE tar archive of the readable .py files and .py symlinks (as links, never followed).
A file's fate is known from these records alone: stderr is never parsed (it is localised and
its writes interleave). A name listed R but missing from the archive is reported unreadable.
Exit 3: missing path, 4: cannot enter or read it, 5: not a dir or .py file, 6: no find/tar
(use SFTP), 7: malformed stdin.
"""

from __future__ import annotations

import shlex

MARKER = b"KVTRACE2\0"

_PRUNE = '"(" -type d "(" -name ".*" -o -name __pycache__ ")" -prune ")" -o'
_EACH = "-exec sh -c 'for f; do {body}; done' sh {{}} +"  # inner script in double quotes only
_DIR = _EACH.format(body='[ -r "$f" ] && [ -x "$f" ] || printf "D\\0%s\\0" "$f"')
_BIG = _EACH.format(body='printf "S\\0%s\\0%s\\0" "$(ls -lnLd -- "$f")" "$f"')
_LINK = _EACH.format(body='[ -d "$f" ] && printf "L\\0%s\\0%s\\0" "$f" "$(cd -P -- "$f" 2>/dev/null && pwd -P)"')
_READ = _EACH.format(body='if [ -r "$f" ]; then printf "R\\0%s\\0" "$f"; else printf "U\\0%s\\0" "$f"; fi')

SCRIPT = (
    "IFS= read -r r || exit 7; read -r n || exit 7; read -r n1 || exit 7; "
    "command -v find >/dev/null && command -v tar >/dev/null || exit 6; "
    'if [ -d "$r" ]; then cd -- "$r" 2>/dev/null && [ -r . ] || exit 4; s=.; m=1; h=; '
    'elif [ -f "$r" ]; then case $r in *.py) ;; *) exit 5;; esac; '
    'case $r in */*) d=${r%/*}; s=./${r##*/};; *) d=.; s=./$r;; esac; '
    'cd -- "${d:-/}" 2>/dev/null || exit 4; m=0; h=-h; '
    'elif [ -e "$r" ]; then exit 5; else exit 3; fi; '
    "printf 'KVTRACE2\\0%s\\0' \"$(pwd -P)\"; "
    f'find -H "$s" -mindepth $m {_PRUNE} -type d {_DIR} '
    f'-o -type l {_LINK} '
    f'-o -type f -name "*.py" -size +"$n"c {_BIG} '
    f'-o -type f -name "*.py" {_READ}; '
    "printf 'E\\0'; "
    f'find -H "$s" -mindepth $m {_PRUNE} "(" -type l -o -type f -size -"$n1"c ")" -name "*.py" '
    "-print0 | tar $h --null --no-recursion -T - -cf -"
)

COMMAND = "sh -c " + shlex.quote(SCRIPT)


def stdin_payload(path: str, max_file_bytes: int) -> bytes:
    """What the script reads: the path and the limit, one per line (the path has no newline)."""
    assert path.isprintable(), "control characters are refused before connecting"
    return f"{path}\n{max_file_bytes}\n{max_file_bytes + 1}\n".encode("utf-8", "surrogateescape")
