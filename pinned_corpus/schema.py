"""
The schema of pinned_corpus/manifest.json (docs/data.md, "The manifest"), checked when pinned_corpus.load_manifest reads it:

    problem(manifest) -> str | None      what is wrong with the first entry that breaks it, in words; None if nothing

A hand-written check of the keys and types that pinned_corpus/build.py and corpus.py read, so that a hand-edited manifest
(a source without its sha256, "sources" written as an object, no tokenizer entry) is one line naming the entry
instead of a KeyError or TypeError somewhere later. Keys the code does not read ("kind") are not checked.
"""
import json
import re

SHA256 = re.compile(r"[0-9a-f]{64}")
REGISTRIES = ("pypi", "npm", "debian")
SUBSETS = ("cpu", "laptop", "full")   # nested: cpu within laptop within full
# key -> what its value must be: a type, a tuple of allowed strings, "sha256" or "patterns" (a list of strings)
ARTIFACT = {"id": str, "registry": REGISTRIES, "name": str, "version": str, "filename": str, "sha256": "sha256"}
SOURCE = {**ARTIFACT, "size": int, "subset": SUBSETS, "format": str, "include": "patterns", "licence": str,
          "what": str}
TOKENIZER = {**ARTIFACT, "member": str, "member_sha256": "sha256"}
TEXT = {"documents": int, "chars": int, "tokens": int, "text_sha256": "sha256"}
SPLIT = {"documents": int, "tokens": int, "sha256": "sha256"}
ARCHIVE = {"filename": str, "size": int, "sha256": "sha256", "chars": int, "content": dict}
CONTENT = {"sha256": "sha256", "bytes": int, "documents": int, "lines": str}
NAMES = {str: "a string", int: "an integer", dict: "an object", list: "a list", float: "a number",
         bool: "true or false", type(None): "null"}


def shown(value) -> str:
    """The value as the manifest writes it (JSON), cut to 40 characters."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def kind_of(value) -> str:
    return NAMES.get(type(value), type(value).__name__)


def wanted(want) -> str:
    if isinstance(want, tuple):
        return " or ".join(f'"{w}"' for w in want)
    return {"sha256": "64 lower-case hex digits", "patterns": "a list of shell patterns"}.get(want) or \
        NAMES[want]


def fits(value, want) -> bool:
    if want == "sha256":
        return isinstance(value, str) and SHA256.fullmatch(value) is not None
    if want == "patterns":
        return isinstance(value, list) and bool(value) and all(isinstance(p, str) for p in value)
    if isinstance(want, tuple):
        return value in want
    if want is float:
        return type(value) in (int, float)
    return type(value) is want   # not isinstance: true is no integer here


def entry_problem(entry, where: str, keys: dict) -> str | None:
    if not isinstance(entry, dict):
        return f"{where} is {kind_of(entry)}, not an object"
    for key, want in keys.items():
        if key not in entry:
            return f"{where} has no \"{key}\" ({wanted(want)})"
        if not fits(entry[key], want):
            return f"{where}'s \"{key}\" is {shown(entry[key])}, not {wanted(want)}"
    return None


def source_problem(src, where: str) -> str | None:
    problem = entry_problem(src, where, SOURCE)
    exclude = src.get("exclude", []) if isinstance(src, dict) else []
    if problem is None and not (isinstance(exclude, list) and all(isinstance(p, str) for p in exclude)):
        problem = f"{where}'s \"exclude\" is {shown(exclude)}, not {wanted('patterns')}"
    if problem is None and src["registry"] == "debian" and not isinstance(src.get("path"), str):
        problem = f"{where} has no \"path\" (a string: the .deb's path in Debian's pool), which a Debian source needs"
    return problem


def subset_problem(rec, where: str) -> str | None:
    problem = entry_problem(rec, where, {"sources": dict, "splits": dict})
    problem = problem or entry_problem(rec["splits"], f"{where}.splits", {"train": dict, "val": dict})
    for split in ("train", "val"):
        problem = problem or entry_problem(rec["splits"][split], f"{where}.splits.{split}", SPLIT)
    for split in (("train", "val") if problem is None and "bytes_splits" in rec else ()):
        problem = problem or entry_problem(rec["bytes_splits"], f"{where}.bytes_splits", {"train": dict, "val": dict})
        problem = problem or entry_problem(rec["bytes_splits"][split], f"{where}.bytes_splits.{split}", SPLIT)
    for sid, per in (rec["sources"].items() if problem is None else ()):
        problem = problem or entry_problem(per, f"{where}.sources.{sid}", {"train": dict, "val": dict,
                                                                            "code_share": float})
        for split in ("train", "val"):
            problem = problem or entry_problem(per[split], f"{where}.sources.{sid}.{split}", TEXT)
    return problem


def problem(manifest) -> str | None:
    """The first thing wrong with the manifest, as "ENTRY ...: what is wrong"; None when nothing is."""
    if not isinstance(manifest, dict):
        return f"the file holds {kind_of(manifest)}, not an object"
    sources = manifest.get("sources")
    if "sources" not in manifest:
        return "there is no \"sources\" list (the registry artifacts the corpus is read from)"
    if not isinstance(sources, list) or not sources:
        return f"\"sources\" is {'an empty list' if sources == [] else kind_of(sources)}, not a list of sources"
    seen = set()
    for k, src in enumerate(sources):
        named = isinstance(src, dict) and isinstance(src.get("id"), str)
        where = f"sources[{k}]" + (f" ({src['id']})" if named else "")
        if p := source_problem(src, where):
            return p
        if src["id"] in seen:
            return f"{where}: the id {shown(src['id'])} is used twice"
        seen.add(src["id"])
    if "tokenizer" not in manifest:
        return "there is no \"tokenizer\" entry (the pinned sdist that holds GPT-2's BPE ranks)"
    if p := entry_problem(manifest["tokenizer"], "\"tokenizer\"", TOKENIZER):
        return p
    subsets = manifest.get("subsets", {})
    if not isinstance(subsets, dict):
        return f"\"subsets\" is {kind_of(subsets)}, not an object"
    for name, rec in subsets.items():
        if p := subset_problem(rec, f"subsets.{name}"):
            return p
    if "archive" in manifest:
        return (entry_problem(manifest["archive"], "\"archive\"", ARCHIVE)
                or entry_problem(manifest["archive"]["content"], "archive.content", CONTENT))
    return None
