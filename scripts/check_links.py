#!/usr/bin/env python3
"""Checks the links of the project's Markdown files, without the network.

    python scripts/check_links.py                 # README.md and docs/*.md
    python scripts/check_links.py FILE.md ...     # just these

Every inline link or image (``[text](target)``, ``![alt](target)``) and every reference
definition (``[name]: target``) outside code is checked:

* a relative path must name a file or directory that exists (relative to the file that links);
* an ``#anchor``, alone or after a ``.md`` path, must be a heading of that Markdown file
  (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens, ``-1``, ``-2`` ... for
  repeated headings) or an explicit ``<a id="...">`` / ``<a name="...">``;
* an ``http``/``https`` link must be well formed (a host, no spaces); it is not fetched;
* ``mailto:`` links are accepted; any other scheme is reported.

Links inside fenced code, code spans and HTML comments are not links and are skipped.

Prints one line per broken link (``file:line: target: why``) and exits 1 if there was any.
"""

import argparse
import glob
import os
import re
import sys
import urllib.parse
from typing import Dict, Iterator, List, Optional, Set, Tuple

FENCE = re.compile(r"^\s{0,3}(```+|~~~+)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target "title"): the text may hold one level of brackets, the target balanced parens.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"
                         r"\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)"
                         r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
HTML_COMMENT = re.compile(r"<!--.*?-->")
HTML_ANCHOR = re.compile(r"<a\s+[^>]*\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading whose Markdown source is ``heading``."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)   # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)                       # inline HTML tags
    text = text.replace("*", "")
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _lines_outside_code(text: str) -> Iterator[Tuple[int, str]]:
    """(line number, line) for every line not inside a fenced code block, with code spans
    and HTML comments blanked out."""
    fence: Optional[str] = None
    in_comment = False
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * 3
            continue
        if fence is not None:
            if m and m.group(1).startswith(fence):
                fence = None
            continue
        line = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        if in_comment:
            end = line.find("-->")
            if end < 0:
                continue
            line = " " * (end + 3) + line[end + 3:]
            in_comment = False
        line = HTML_COMMENT.sub(lambda m: " " * len(m.group(0)), line)
        start = line.find("<!--")
        if start >= 0:
            line, in_comment = line[:start], True
        yield number, line


def anchors_of(path: str, cache: Dict[str, Set[str]]) -> Set[str]:
    """Every anchor a link may name in the Markdown file ``path``."""
    path = os.path.abspath(path)
    if path in cache:
        return cache[path]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    found: Set[str] = set()
    seen: Dict[str, int] = {}
    fence: Optional[str] = None
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * 3
            continue
        if fence is not None:
            if m and m.group(1).startswith(fence):
                fence = None
            continue
        h = HEADING.match(line)
        if h:
            slug = github_anchor(h.group(2))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else "%s-%d" % (slug, n))
        for a in HTML_ANCHOR.findall(line):
            found.add(a)
    cache[path] = found
    return found


def links_of(text: str) -> Iterator[Tuple[int, str]]:
    """(line number, target) of every link outside code."""
    for number, line in _lines_outside_code(text):
        m = REF_DEF.match(line)
        if m:
            yield number, m.group(1).strip("<>")
            continue
        for m in INLINE_LINK.finditer(line):
            yield number, m.group(1).strip("<>")


def check_target(source: str, target: str, cache: Dict[str, Set[str]]) -> Optional[str]:
    """Why the link ``target`` in the file ``source`` is broken, or None when it is fine."""
    if not target:
        return "empty link"
    parsed = urllib.parse.urlsplit(target)
    scheme = parsed.scheme.lower()
    if scheme in ("http", "https"):
        host = parsed.hostname or ""
        if not host or " " in target or ("." not in host and host != "localhost"):
            return "malformed %s URL" % scheme
        return None
    if scheme == "mailto":
        return None
    if scheme:
        return "unsupported scheme '%s:'" % scheme
    path, _, anchor = target.partition("#")
    path = urllib.parse.unquote(path)
    if path:
        if path.startswith("/"):
            return "absolute path (use a path relative to the file)"
        resolved = os.path.normpath(os.path.join(os.path.dirname(source), path))
        if not os.path.exists(resolved):
            return "no such file: %s" % os.path.relpath(resolved)
    else:
        resolved = source
    if anchor:
        if os.path.isdir(resolved) or not resolved.endswith(".md"):
            return "an anchor on a file that is not Markdown"
        if urllib.parse.unquote(anchor) not in anchors_of(resolved, cache):
            return "no heading or anchor '#%s' in %s" % (anchor, os.path.relpath(resolved))
    return None


def check_files(paths: List[str]) -> List[str]:
    """One message per broken link in the files ``paths``."""
    cache: Dict[str, Set[str]] = {}
    problems: List[str] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for number, target in links_of(text):
            why = check_target(path, target, cache)
            if why:
                problems.append("%s:%d: %s: %s" % (path, number, target, why))
    return problems


def default_files(root: str) -> List[str]:
    """README.md and docs/*.md under ``root``."""
    files = [os.path.join(root, "README.md")]
    files += sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    return [f for f in files if os.path.exists(f)]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="Markdown files (default: README.md, docs/*.md)")
    args = parser.parse_args(argv)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = args.files or default_files(root)
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        print("check_links: no such file: %s" % ", ".join(missing), file=sys.stderr)
        return 2
    problems = check_files(files)
    for p in problems:
        print(p)
    if problems:
        print("check_links: %d broken link(s) in %d file(s)" % (len(problems), len(files)),
              file=sys.stderr)
        return 1
    print("check_links: %d file(s), every link resolves" % len(files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
