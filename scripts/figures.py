#!/usr/bin/env python3
"""Every measured figure in README.md, docs/ and the rustdoc (so `--help`) points at the result file that measured it.

A figure is a number with a unit (B, KiB, MiB, GiB, ms, s, min, tasks, goroutines, x) or a count
of (open, TCP, shared) connections, watches or statuses. The unit of citation is a block: a paragraph, a list item or a table row (fenced code is skipped). A block
holding a figure must cite a result file (a link or a backticked path under benches/results/),
or, for a size, limit or constant of the code, the Rust file that defines it,
and every figure of a citing block must appear in one of the files it cites. Figures that are
defaults, limits or targets rather than measurements are listed, with the reason, in
scripts/figures-allow.txt. Result files must name the commit that produced them.

Usage: python3 scripts/figures.py [FILE...]   (default: README.md, docs/*.md, src/ and crates/*/src/
doc comments); exit 1 on a finding.
"""

import decimal
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
UNITS = r"(?:B|KiB|MiB|GiB|KB|MB|GB|ms|s|min|tasks|goroutines|(?:(?:open|TCP|shared)\s+)?(?:connections?|watch(?:es)?)|statuses|×)"
# A number (1,000 / 15.8 / 0.002), optionally a range (93–94) or a pair (19 / 22), then a unit.
FIGURE = re.compile(
    r"(?<![\w.$/])(?P<num>[-−]?\d[\d,]*(?:\.\d+)?)(?P<more>(?:\s*[–/-]\s*\d[\d,]*(?:\.\d+)?)*)"
    r"(?:\s|(?=×))(?P<unit>" + UNITS + r")(?![\w-])"
)
# A result file (or folder) under benches/results, or the source file that defines a size, a
# limit or a constant the figure states (its number must appear there too).
CITATION = re.compile(r"(benches/results/[\w./-]*\w|(?:src|crates|tests|benches)/[\w./-]+\.rs)")
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")


def blocks(text):
    """Yields (line number, block text): paragraphs, list items and table rows."""
    in_code = False
    current, start = [], 0
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            if current:
                yield start, "\n".join(current)
                current = []
            continue
        if in_code:
            continue
        stripped = line.strip()
        starts_item = stripped.startswith(("|", "- ", "* ", "#")) or re.match(r"\d+\. ", stripped)
        if not stripped or starts_item:
            if current:
                yield start, "\n".join(current)
                current = []
        if stripped:
            if not current:
                start = number
            current.append(line)
            if stripped.startswith(("|", "#")):
                yield start, "\n".join(current)
                current = []
    if current:
        yield start, "\n".join(current)


def allowed():
    figures = set()
    for line in (ROOT / "scripts/figures-allow.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            figures.add(normal(line))
    return figures


def normal(figure):
    return re.sub(r"\s+", " ", figure.replace(" ", " ")).strip()


def numbers(match):
    raw = match.group("num") + match.group("more")
    return [n for n in re.split(r"(?<=\d)\s*[–/-]\s*", raw) if n]


def value(number):
    return decimal.Decimal(number.replace(",", "").replace("−", "-"))


def found(number, values):
    """A figure is found when a number of the file equals it, or rounds to it at the figure's
    own precision when the figure has decimals (11.0 is 11.01 rounded; 21 is not 21.4)."""
    want = value(number)
    places = -want.as_tuple().exponent
    if places <= 0:
        return want in values
    step = decimal.Decimal(1).scaleb(-places)
    return any(v.quantize(step, rounding=decimal.ROUND_HALF_UP) == want for v in values)


def file_values(text):
    text = re.sub(r"(?<=\d)_(?=\d)", "", text)  # Rust's 16_384
    return {value(n.rstrip(",")) for n in re.findall(r"[-−]?\d(?:\d|,\d{3})*(?:\.\d+)?", text)}


def cited_texts(path):
    target = ROOT / path.rstrip("/.,)")
    if target.is_dir():
        files = sorted(p for p in target.rglob("*") if p.suffix in (".md", ".txt", ".json", ".csv", ".dat"))
    elif target.is_file():
        files = [target]
    else:
        return None
    return [(f, f.read_text(errors="replace")) for f in files]


def check(path, allow):
    findings = []
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    text = path.read_text()
    if path.suffix == ".rs":
        # Rustdoc (and so `--help`, which clap takes from it): doc comments only, line numbers kept.
        text = "\n".join(
            re.sub(r"^\s*//[/!] ?", "", l) if re.match(r"^\s*//[/!]", l) else "" for l in text.splitlines()
        )
    # In Rust, a figure the file's own code states (a constant, a deadline) cites that code.
    own = set()
    if path.suffix == ".rs":
        code = "\n".join(l for l in path.read_text().splitlines() if not re.match(r"^\s*//", l))
        own = file_values(code)
    for line, block in blocks(text):
        if block.lstrip().startswith("#"):
            continue
        # Link targets and inline code (flag values, paths, commands) are not prose figures.
        prose = re.sub(r"\]\([^)]*\)", "]", block)
        prose = re.sub(r"`[^`]*`", "", prose)
        figures = [
            m
            for m in FIGURE.finditer(prose)
            if normal(m.group(0)) not in allow and not all(found(n, own) for n in numbers(m))
        ]
        cites = CITATION.findall(block)
        for cite in sorted({c for c in cites if cited_texts(c) is None}):
            findings.append(f"{rel}:{line}: cites {cite}, which does not exist")
        if not figures:
            continue
        if not cites:
            for m in figures:
                findings.append(f"{rel}:{line}: {normal(m.group(0))!r} cites no result file")
            continue
        texts = []
        for cite in cites:
            got = cited_texts(cite)
            if got is None:
                continue
            texts += [t for _, t in got]
        values = set().union(*(file_values(t) for t in texts)) if texts else set()
        for m in figures:
            missing = [n for n in numbers(m) if not found(n, values)]
            if missing:
                findings.append(
                    f"{rel}:{line}: {normal(m.group(0))!r}: {', '.join(missing)} not found in "
                    + ", ".join(sorted(set(cites)))
                )
    return findings


def uncommitted_results():
    """Result files (md) that name no commit."""
    findings = []
    for f in sorted((ROOT / "benches/results").rglob("*.md")):
        head = "\n".join(f.read_text(errors="replace").splitlines()[:15])
        if not COMMIT.search(head):
            findings.append(f"{f.relative_to(ROOT)}: names no commit in its first 15 lines")
    return findings


def main(argv):
    # docs/reliability.md is a result file itself: generated by scripts/reliability.sh, naming
    # its commit, and checked against CI's own test run by `reliability.sh --check`.
    docs = [p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "reliability.md"]
    rustdoc = sorted((ROOT / "src").glob("*.rs")) + sorted((ROOT / "crates").glob("*/src/**/*.rs"))
    files = [pathlib.Path(a).resolve() for a in argv] or [ROOT / "README.md", *docs, *rustdoc]
    allow = allowed()
    findings = uncommitted_results()
    for f in files:
        findings += check(f, allow)
    for finding in findings:
        print(finding)
    if findings:
        print(f"figures: {len(findings)} finding(s); cite the result file, or list a default or limit in scripts/figures-allow.txt", file=sys.stderr)
        return 1
    print(f"figures: every measured figure in {len(files)} file(s) cites its result file", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
