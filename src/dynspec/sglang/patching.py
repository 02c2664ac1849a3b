"""`dynspec patch status|apply|revert`: put dynspec's switch into an installed SGLang (the diffs:
unified_diff; the writes, all or none across crashes: patch_transaction).

Patches live in patches/sglang-<version>/ (canonical copy: src/dynspec/sglang/patches/, so
they ship inside the package; the top-level patches/ folder of a checkout links to
it).  Each folder holds a short series of unified diffs, applicable with
`patch -p1` from the site-packages directory, and manifest.json:

    {"format": 1, "package": "sglang", "version": "0.5.9",
     "patches": [{"file": "0001-....patch", "sha256": "..."}, ...],
     "files": {"sglang/srt/...py": {"upstream_sha256": "...", "patched_sha256": "..."}}}

The tool applies the diffs with its own pure-Python applier, in memory, and checks
every result against the manifest before it writes anything.  Writes go through
temporary files and os.replace, all files or none (rolled back on failure).  The
upstream bytes are kept in <sglang>/.dynspec-backup/ for revert, which restores
them byte for byte (or, if the backup is gone, reverse-applies the series and
checks the upstream hash).

Each apply and revert is journalled (<sglang>/.dynspec-journal.json, written before
the first rename, removed after the last): one a crash interrupted is finished by the
next apply or revert, and `status` says "interrupted" until then.

Exit status: 0 done (or nothing to do); 1 `status` found foreign-modified,
interrupted or unsupported-version; 2 refused (one line on stderr, nothing changed).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from dynspec.sglang.patch_transaction import (  # noqa: F401  (re-exported: the command's vocabulary)
    BACKUP_DIR, JOURNAL, TMP_SUFFIX, Refusal, Target, _check_no_links, _check_writable, exclusive, recover, sha256,
    write_all)
from dynspec.sglang.unified_diff import (  # noqa: F401
    FilePatch, Hunk, PatchApplyError, PatchFormatError, apply_hunks, parse_unified)

ENV_PATCHES = "DYNSPEC_PATCHES"
BACKUP_STATE = "state.json"
MANIFEST = "manifest.json"

EXIT_OK, EXIT_STATE, EXIT_REFUSED = 0, 1, 2

UNPATCHED, PATCHED, FOREIGN, UNSUPPORTED = "unpatched", "patched", "foreign-modified", "unsupported-version"
STALE = "patched-by-another-dynspec"  # an earlier dynspec release's series (its manifest lists their hashes)
INTERRUPTED = "interrupted"




# --- patch sets and manifests ----------------------------------------------------------




def _decode(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def patches_root() -> Path:
    """Where patches/sglang-<version>/ folders live: $DYNSPEC_PATCHES, else inside the package."""
    env = os.environ.get(ENV_PATCHES, "").strip()
    return Path(env) if env else Path(__file__).resolve().parent / "patches"


def available_versions(root: Path | None = None) -> list[str]:
    root = root or patches_root()
    if not root.is_dir():
        return []
    found = [p.name[len("sglang-"):] for p in root.iterdir()
             if p.name.startswith("sglang-") and (p / MANIFEST).is_file()]
    return sorted(found, key=_version_key)


def _version_key(v: str):
    return [(0, int(x), "") if x.isdigit() else (1, 0, x) for x in re.split(r"[.+-]", v)]


@dataclass
class PatchSet:
    version: str
    folder: Path
    patches: list[tuple[str, list[FilePatch]]]  # series order
    files: dict[str, tuple[str, str]]  # rel path -> (upstream sha256, patched sha256)
    earlier: dict[str, frozenset[str]] = field(default_factory=dict)  # rel path -> earlier releases' patched sha256


def load_patchset(version: str, root: Path | None = None) -> PatchSet | None:
    """The patch series for one sglang version; None if dynspec has none; Refusal if damaged."""
    folder = (root or patches_root()) / f"sglang-{version}"
    mpath = folder / MANIFEST
    if not mpath.is_file():
        return None
    try:
        manifest = json.loads(mpath.read_text())
        if manifest.get("format") != 1 or manifest.get("version") != version:
            raise ValueError(f"format/version fields say {manifest.get('format')!r}/{manifest.get('version')!r}")
        files = {rel: (str(v["upstream_sha256"]), str(v["patched_sha256"]))
                 for rel, v in manifest["files"].items()}
        earlier = {rel: frozenset(str(h) for h in v.get("earlier_patched_sha256", []))
                   for rel, v in manifest["files"].items()}
        entries = [(str(e["file"]), str(e["sha256"])) for e in manifest["patches"]]
        if not entries or not files:
            raise ValueError("no patches or no files listed")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise Refusal(f"damaged patch set {folder}: bad {MANIFEST} ({exc})") from None
    patches = []
    touched: set[str] = set()
    for name, digest in entries:
        p = folder / name
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise Refusal(f"damaged patch set {folder}: cannot read {name} ({exc.strerror})") from None
        if sha256(data) != digest:
            raise Refusal(f"damaged patch file {p}: sha256 differs from {MANIFEST}")
        try:
            fps = parse_unified(_decode(data))
        except PatchFormatError as exc:
            raise Refusal(f"damaged patch file {p}: {exc}") from None
        for fp in fps:
            if fp.path not in files:
                raise Refusal(f"damaged patch set {folder}: {name} touches {fp.path}, not listed in {MANIFEST}")
            touched.add(fp.path)
        patches.append((name, fps))
    if touched != set(files):
        missing = ", ".join(sorted(set(files) - touched))
        raise Refusal(f"damaged patch set {folder}: {MANIFEST} lists files no patch touches: {missing}")
    return PatchSet(version, folder, patches, files, earlier)


def render(ps: PatchSet, contents: dict[str, bytes], *, reverse: bool = False) -> dict[str, bytes]:
    """Apply the series (or reverse it) to contents {rel: bytes}; PatchApplyError on mismatch."""
    texts = {rel: _decode(b) for rel, b in contents.items()}
    series = list(reversed(ps.patches)) if reverse else ps.patches
    for _, fps in series:
        for fp in fps:
            texts[fp.path] = apply_hunks(texts[fp.path], fp.hunks, reverse=reverse, name=fp.path)
    return {rel: _encode(t) for rel, t in texts.items()}


def build_manifest(version: str, folder: Path, upstream_root: Path, previous: dict | None = None) -> dict:
    """Manifest for the .patch files in `folder` against an upstream sglang tree (maintainers).
    `previous` (the manifest it replaces) hands on the patched hashes of earlier releases, so a
    tree patched by one of them is recognised, brought up to date by apply and reverted."""
    names = sorted(p.name for p in folder.glob("*.patch"))
    if not names:
        raise Refusal(f"no .patch files in {folder}")
    ps = PatchSet(version, folder, [], {})
    upstream: dict[str, bytes] = {}
    for name in names:
        fps = parse_unified(_decode((folder / name).read_bytes()))
        ps.patches.append((name, fps))
        for fp in fps:
            if fp.path not in upstream:
                upstream[fp.path] = (upstream_root / fp.path).read_bytes()
    patched = render(ps, upstream)
    return {
        "format": 1,
        "package": "sglang",
        "version": version,
        "patches": [{"file": n, "sha256": sha256((folder / n).read_bytes())} for n in names],
        "files": {rel: _file_entry(sha256(upstream[rel]), sha256(patched[rel]),
                                   ((previous or {}).get("files") or {}).get(rel))
                  for rel in sorted(upstream)},
    }


def _file_entry(up: str, patched: str, before: dict | None) -> dict:
    entry: dict = {"upstream_sha256": up, "patched_sha256": patched}
    if before and before.get("upstream_sha256") == up:
        earlier = set(before.get("earlier_patched_sha256", [])) | {before.get("patched_sha256")}
        earlier = {h for h in earlier if isinstance(h, str) and h != patched}
        if earlier:
            entry["earlier_patched_sha256"] = sorted(earlier)
    return entry


# --- the installed sglang --------------------------------------------------------------




_VERSION_RE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)


def read_version(pkg: Path) -> str | None:
    """sglang's version without importing it: _version.py, else the dist-info next to it."""
    vfile = pkg / "_version.py"
    if vfile.is_file():
        m = _VERSION_RE.search(vfile.read_text(errors="replace"))
        if m:
            return m[1]
    for meta in sorted(pkg.parent.glob("sglang-*.dist-info/METADATA")):
        for line in meta.read_text(errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
            if not line.strip():
                break
    return None


def find_sglang(path: str | os.PathLike | None = None) -> Target:
    """The sglang to patch: --sglang-path (site-packages dir or the sglang dir), else the
    one this Python would import (located without importing it)."""
    if path is not None:
        p = Path(path).expanduser()
        if (p / "sglang" / "__init__.py").is_file():
            root = p
        elif p.name == "sglang" and (p / "__init__.py").is_file():
            root = p.parent
        else:
            raise Refusal(f"no sglang found at {p} (give the site-packages directory or the sglang package directory)")
    else:
        try:
            spec = importlib.util.find_spec("sglang")
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            raise Refusal(f"no sglang found for {sys.executable}; install sglang or pass --sglang-path DIR")
        root = Path(list(spec.submodule_search_locations)[0]).resolve().parent
    return Target(root, read_version(root / "sglang"))


@dataclass
class Status:
    state: str
    target: Target
    patchset: PatchSet | None
    current: dict[str, bytes | None] = field(default_factory=dict)
    detail: str = ""

    def line(self) -> str:
        version = self.target.version or "unknown"
        text = f"{self.state} {version} {self.target.pkg}"
        return f"{text}: {self.detail}" if self.detail else text


def _backed_up(target: Target, ps: PatchSet, rel: str) -> bytes | None:
    """The upstream bytes of `rel` an earlier apply kept in the backup, if they are intact."""
    try:
        state = json.loads((target.backup / BACKUP_STATE).read_text())
        data = (target.backup / rel).read_bytes()
    except (OSError, ValueError):
        return None
    up = ps.files[rel][0]
    if not isinstance(state, dict) or state.get("version") != ps.version or sha256(data) != up:
        return None
    return data


def status(target: Target, root: Path | None = None) -> Status:
    if (target.pkg / JOURNAL).exists() or (target.pkg / JOURNAL).is_symlink():
        return Status(INTERRUPTED, target, None, detail=f"an apply or revert was interrupted ({target.pkg / JOURNAL}); "
                                                        f"`dynspec patch apply` or `revert` finishes it")
    if target.version is None:
        return Status(UNSUPPORTED, target, None, detail="cannot read sglang's version")
    ps = load_patchset(target.version, root)
    if ps is None:
        have = ", ".join(available_versions(root)) or "none"
        return Status(UNSUPPORTED, target, None, detail=f"dynspec has patches for sglang {have}")
    current: dict[str, bytes | None] = {}
    states = []
    for rel, (up, patched) in ps.files.items():
        f = target.root / rel
        try:
            data = f.read_bytes()
        except FileNotFoundError:
            current[rel] = None
            states.append((rel, "missing"))
            continue
        except OSError as exc:
            raise Refusal(f"cannot read {f} ({exc.strerror})") from None
        current[rel] = data
        h = sha256(data)
        states.append((rel, "upstream" if h == up else "patched" if h == patched
                       else "stale" if h in ps.earlier.get(rel, ()) else "other"))
    kinds = {s for _, s in states}
    if kinds == {"upstream"}:
        return Status(UNPATCHED, target, ps, current)
    if kinds == {"patched"}:
        return Status(PATCHED, target, ps, current)
    if "stale" in kinds and kinds <= {"stale", "patched", "upstream"}:
        n = sum(1 for _, s in states if s == "stale")
        return Status(STALE, target, ps, current,
                      f"{n} file(s) patched by another dynspec release; `dynspec patch apply` brings them to this "
                      "one, `dynspec patch revert` restores upstream")
    odd = [f"{rel} ({s})" for rel, s in states if s in ("other", "missing")]
    if odd:
        detail = f"{odd[0]} matches neither the upstream {ps.version} file nor dynspec's patched one"
        if len(odd) > 1:
            detail += f" (+{len(odd) - 1} more)"
    else:
        done = sum(1 for _, s in states if s == "patched")
        detail = f"partly patched ({done} of {len(states)} files)"
    return Status(FOREIGN, target, ps, current, detail)




# --- the operations --------------------------------------------------------------------


@dataclass
class Outcome:
    code: int
    message: str


def _require(st: Status) -> PatchSet:
    if st.state == UNSUPPORTED:
        raise Refusal(f"refused: sglang {st.target.version or '(unknown version)'} at {st.target.pkg} is "
                      f"unsupported ({st.detail}); nothing changed")
    assert st.patchset is not None
    return st.patchset


@dataclass
class _Start:
    """Where apply or revert starts from."""

    note: str  # what recovering an interrupted operation did ("" if nothing)
    ps: PatchSet
    where: str  # "sglang <version> at <package>", for messages
    files: dict[str, bytes]  # the patched-over files as they are now
    done: Outcome | None  # the tree is already where the operation would take it
    state: str  # the tree's state before the operation


def _start(target: Target, dry_run: bool, root: Path | None, goal: str, already: str, nothing: str) -> _Start:
    """Before apply or revert: the backup folder must be real, an interrupted operation is
    finished, foreign-modified files are refused, and a tree already in `goal` is done."""
    _check_no_links(target.root, [target.backup])
    if dry_run:
        st = status(target, root)
        if st.state == INTERRUPTED:
            raise Refusal(f"{st.detail} (a dry run changes nothing)")
        note = ""
    else:
        ps_files = load_patchset(target.version, root) if target.version is not None else None
        note = recover(target, ps_files.files if ps_files else ())
        st = status(target, root)
    ps = _require(st)
    where = f"sglang {ps.version} at {target.pkg}"
    if st.state == FOREIGN:
        raise Refusal(f"refused: {where} is foreign-modified: {st.detail}; nothing changed")
    done = Outcome(EXIT_OK, f"{note}{already}: {where}" + ("" if note else f"; {nothing}")) if st.state == goal else None
    return _Start(note, ps, where, {rel: data for rel, data in st.current.items() if data is not None}, done, st.state)


def do_apply(target: Target, *, dry_run: bool = False, root: Path | None = None) -> Outcome:
    with exclusive(target):
        return _apply(target, dry_run=dry_run, root=root)


def do_revert(target: Target, *, dry_run: bool = False, root: Path | None = None) -> Outcome:
    with exclusive(target):
        return _revert(target, dry_run=dry_run, root=root)


def _apply(target: Target, *, dry_run: bool, root: Path | None) -> Outcome:
    start = _start(target, dry_run, root, PATCHED, "already patched", "nothing changed")
    if start.done is not None:
        return start.done
    note, ps, where, originals = start.note, start.ps, start.where, start.files
    if start.state == STALE:  # another release's series: start again from the upstream bytes
        originals = _upstream_bytes(target, ps, originals)
    try:
        patched = render(ps, originals)
    except PatchApplyError as exc:
        raise Refusal(f"damaged patch set {ps.folder}: {exc}; nothing changed") from None
    for rel, data in patched.items():
        if sha256(data) != ps.files[rel][1]:
            raise Refusal(f"damaged patch set {ps.folder}: patched {rel} does not match {MANIFEST}; nothing changed")
    if dry_run:
        return Outcome(EXIT_OK, f"would patch {where}: {len(patched)} files ({', '.join(sorted(patched))})")
    paths = [target.root / rel for rel in patched]
    _check_writable(paths + [target.pkg])
    # The backup (upstream bytes + state) goes in the same transaction as the patched files.
    state = {"package": "sglang", "version": ps.version,
             "files": {rel: ps.files[rel][0] for rel in sorted(patched)}}
    writes: dict[Path, bytes] = {target.backup / rel: originals[rel] for rel in patched}
    writes[target.backup / BACKUP_STATE] = (json.dumps(state, indent=2) + "\n").encode()
    writes.update({target.root / rel: data for rel, data in patched.items()})
    backup_existed = target.backup.exists()
    try:
        write_all(target, writes, op="apply")
    except Refusal:
        if not backup_existed:
            shutil.rmtree(target.backup, ignore_errors=True)
        raise
    after = status(target, root)
    if after.state != PATCHED:  # should not happen: every byte was checked above
        raise Refusal(f"apply left {where} {after.state}: {after.detail}")
    return Outcome(EXIT_OK, f"{note}patched: {where}: {len(patched)} files; upstream copies kept in {target.backup} for revert")


def _upstream_bytes(target: Target, ps: PatchSet, current: dict[str, bytes]) -> dict[str, bytes]:
    """The upstream files: as they are where untouched, else from the backup when it is intact,
    else by reversing the series."""
    out: dict[str, bytes] = {}
    for rel, (up, _) in ps.files.items():
        data = current.get(rel)
        kept = data if data is not None and sha256(data) == up else _backed_up(target, ps, rel)
        if kept is None:
            break
        out[rel] = kept
    else:
        return out
    for rel, data in current.items():
        if sha256(data) in ps.earlier.get(rel, ()):  # an earlier series: only its backup can undo it
            raise Refusal(f"cannot rebuild upstream {rel}: an earlier dynspec release patched it and "
                          f"{target.backup} holds no intact copy; reinstall sglang {ps.version}, then "
                          "`dynspec patch apply`; nothing changed")
    try:
        out = render(ps, current, reverse=True)
    except PatchApplyError as exc:
        raise Refusal(f"cannot rebuild the upstream files ({exc}); nothing changed") from None
    for rel, data in out.items():
        if sha256(data) != ps.files[rel][0]:
            raise Refusal(f"cannot rebuild upstream {rel} (no intact backup in {target.backup}); nothing changed")
    return out


def _revert(target: Target, *, dry_run: bool, root: Path | None) -> Outcome:
    start = _start(target, dry_run, root, UNPATCHED, "not patched", "nothing to revert")
    if start.done is not None:
        return start.done
    note, ps, where, current = start.note, start.ps, start.where, start.files
    upstream = _upstream_bytes(target, ps, current)
    if dry_run:
        return Outcome(EXIT_OK, f"would revert {where}: {len(upstream)} files ({', '.join(sorted(upstream))})")
    paths = [target.root / rel for rel in upstream]
    _check_writable(paths)
    write_all(target, {target.root / rel: data for rel, data in upstream.items()}, op="revert", remove=target.backup)
    after = status(target, root)
    if after.state != UNPATCHED:
        raise Refusal(f"revert left {where} {after.state}: {after.detail}")
    return Outcome(EXIT_OK, f"{note}reverted: {where}: {len(upstream)} files restored byte for byte")


# --- command line ----------------------------------------------------------------------


def _run(args: argparse.Namespace) -> int:
    try:
        if args.patch_command == "manifest":
            return _manifest(args)
        target = find_sglang(args.sglang_path)
        if args.patch_command == "status":
            with exclusive(target):
                st = status(target)
            print(st.line())
            return EXIT_OK if st.state in (UNPATCHED, PATCHED) else EXIT_STATE
        op = do_apply if args.patch_command == "apply" else do_revert
        out = op(target, dry_run=args.dry_run)
        print(out.message)
        return out.code
    except Refusal as exc:
        msg = str(exc)
        print(msg if msg.startswith("refused") else f"refused: {msg}", file=sys.stderr)
        return EXIT_REFUSED


def _manifest(args: argparse.Namespace) -> int:
    target = find_sglang(args.sglang_path)
    version = args.version or target.version
    if not version:
        raise Refusal("cannot read sglang's version; pass --version")
    folder = patches_root() / f"sglang-{version}"
    try:
        previous = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        previous = None
    manifest = build_manifest(version, folder, target.root, previous if isinstance(previous, dict) else None)
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {folder / MANIFEST}: {len(manifest['patches'])} patches, {len(manifest['files'])} files")
    return EXIT_OK


def add_cli(sub) -> None:
    p = sub.add_parser("patch", help="patch an installed SGLang with dynspec's speculate/plain switch",
                       description="Apply, revert or inspect dynspec's patch of an installed SGLang. "
                                   "Refusals exit 2 with one line and change nothing.")
    psub = p.add_subparsers(dest="patch_command", required=True, metavar="ACTION")
    helps = {
        "status": "print one line: unpatched|patched|foreign-modified|interrupted|unsupported-version, the version, the path",
        "apply": "patch sglang (atomic, idempotent; keeps what revert needs)",
        "revert": "restore every touched file byte for byte",
    }
    for name, text in helps.items():
        a = psub.add_parser(name, help=text)
        a.add_argument("--sglang-path", metavar="DIR",
                       help="site-packages directory (or the sglang package directory); "
                            "default: the sglang this Python imports")
        a.add_argument("--dry-run", action="store_true", help="check everything, write nothing")
        a.set_defaults(func=_run)
    m = psub.add_parser("manifest", help="(maintainers) regenerate manifest.json from the .patch files "
                                         "and a pristine sglang")
    m.add_argument("--sglang-path", metavar="DIR", help="a pristine (unpatched) sglang of that version")
    m.add_argument("--version", help="default: the version found at --sglang-path")
    m.set_defaults(func=_run, dry_run=False)
