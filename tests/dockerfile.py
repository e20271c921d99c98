"""The Dockerfile read as a builder reads it (stages, WORKDIR, ENV, COPY, RUN, USER,
HEALTHCHECK, CMD) and its build context filtered by .dockerignore, so that a test can lay out
exactly the files a build would, without a container engine."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath


@dataclass
class Instruction:
    keyword: str  # upper case
    args: str  # the rest of the line, continuations joined
    workdir: str  # the working directory in force when it runs

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form CMD / ENTRYPOINT / HEALTHCHECK CMD, else None."""
        text = self.args
        if self.keyword == "HEALTHCHECK":
            text = text.split(" CMD ", 1)[1] if " CMD " in f" {text}" else ""
            text = text.removeprefix("CMD ").strip()
        if not text.startswith("["):
            return None
        value: list[str] = json.loads(text)
        return value


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def named(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        """ENV of this stage (`k=v` pairs, quotes allowed), later lines winning."""
        out: dict[str, str] = {}
        for ins in self.named("ENV"):
            for pair in shlex.split(ins.args):
                key, sep, value = pair.partition("=")
                assert sep, f"ENV in the legacy `ENV key value` form: {ins.args}"
                out[key] = value
        return out


@dataclass
class Copy:
    sources: list[str]
    dest: str  # absolute, the stage's WORKDIR applied
    from_stage: str | None


def _logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") and not current:
            continue  # a comment (the parser directive `# syntax=` included)
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction is dropped
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        if current.strip():
            lines.append(current.strip())
        current = ""
    return lines


def parse(path: Path) -> list[Stage]:
    """The stages of a Dockerfile, each with its instructions in order."""
    stages: list[Stage] = []
    workdir = "/"
    for line in _logical_lines(path.read_text()):
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            parts = args.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], name))
            workdir = "/"
            continue
        assert stages, f"{keyword} before any FROM"
        if keyword == "WORKDIR":
            workdir = str(PurePosixPath(workdir) / args.strip())
        stages[-1].instructions.append(Instruction(keyword, args.strip(), workdir))
    return stages


def copies(stage: Stage) -> list[Copy]:
    out = []
    for ins in stage.named("COPY"):
        words = shlex.split(ins.args)
        flags = [w for w in words if w.startswith("--")]
        rest = [w for w in words if not w.startswith("--")]
        from_stage = next((f.split("=", 1)[1] for f in flags if f.startswith("--from=")), None)
        dest = str(PurePosixPath(ins.workdir) / rest[-1])
        out.append(Copy(rest[:-1], dest, from_stage))
    return out


# ---- the build context ----------------------------------------------------------------------


def _pattern(glob: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go's filepath.Match plus `**`) as a regex on a relative path;
    a pattern matching a directory matches everything under it."""
    out = ""
    i = 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif glob.startswith("**", i):
            out += ".*"
            i += 2
        elif glob[i] == "*":
            out += "[^/]*"
            i += 1
        elif glob[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(glob[i])
            i += 1
    return re.compile(out + "(?:/.*)?")


class Context:
    """The build context: the checkout as the daemon receives it after .dockerignore."""

    def __init__(self, root: Path) -> None:
        self.root = root
        ignore = root / ".dockerignore"
        rules = []
        if ignore.exists():
            for line in ignore.read_text().splitlines():
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                negate = line.startswith("!")
                glob = str(PurePosixPath(line.lstrip("!").strip()))
                rules.append((negate, _pattern(glob.lstrip("/"))))
        self.rules = rules

    def included(self, rel: str) -> bool:
        """The last rule matching the path decides (Docker's order)."""
        keep = True
        for negate, pattern in self.rules:
            if pattern.fullmatch(rel):
                keep = negate
        return keep

    def copy(self, source: str, target: Path) -> None:
        """COPY <source> <target>: a directory's contents into target, a file to target."""
        src = self.root / source
        assert src.exists() and self.included(source), \
            f"COPY {source}: not in the build context (missing or excluded by .dockerignore)"
        if src.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
            return
        for path in sorted(src.rglob("*")):
            rel = path.relative_to(self.root).as_posix()
            if path.is_file() and self.included(rel):
                dest = target / path.relative_to(src)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dest)


def lay_out(stage: Stage, context: Context, image_root: Path) -> None:
    """Every COPY of the stage that takes from the build context, under `image_root` as `/`."""
    for cp in copies(stage):
        if cp.from_stage is not None:
            continue
        dest = image_root / cp.dest.lstrip("/")
        many = len(cp.sources) > 1 or cp.dest.endswith("/")
        for source in cp.sources:
            src = context.root / source
            target = dest / src.name if many and src.is_file() else dest
            context.copy(source, target)
