"""Task corpora every machine has: code (the standard library), math (generated), prose (docstrings, licenses).

The built-in targets and the demo's traffic come from here, so nothing is downloaded. Each text is
assigned to a train or held-out split by a stable hash of its origin, so prompts used to measure a
drafter never appear in its training data. Parsing the standard library takes about 8 s on a small core, so
its documents are also kept as JSON in the user's cache directory, keyed by the corpus version and the Python
whose library they come from; each process reads them from there.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import random
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from draftsync.files import atomic_write
from draftsync.speculative.machine import user_cache_dir

if TYPE_CHECKING:
    from draftsync.profiles import SyncProfile


TASKS = ("code", "math", "prose")
HELD_OUT_SHARE = 10  # one origin in ten is held out
CORPUS_VERSION = 2  # bump when the corpora change: cached targets are rebuilt and cached documents re-read


@dataclass(frozen=True)
class Document:
    task: str
    origin: str
    text: str

    @property
    def held_out(self) -> bool:
        digest = hashlib.sha256(f"{self.task}:{self.origin}".encode()).digest()
        return digest[0] % HELD_OUT_SHARE == 0


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "idlelib", "lib2to3", "site-packages", "turtledemo", "tkinter", "ensurepip"}
    files = [p for p in root.rglob("*.py") if not skip.intersection(p.relative_to(root).parts)]
    return sorted(files)


def _strip_docstrings(nodes: list[ast.AST]) -> list[str]:
    """Remove docstrings in place from the `nodes` of a tree and return them: code without prose, prose without
    code."""
    found = []
    for node in nodes:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            first = body[0] if body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    found.append(first.value.value)
                    node.body = body[1:] or [ast.Pass()]
    return found


def _documents_cache_file() -> Path:
    root = sysconfig.get_paths()["stdlib"]
    key = hashlib.sha256(f"{CORPUS_VERSION}|{sys.version}|{root}".encode()).hexdigest()[:16]
    return user_cache_dir() / f"stdlib-documents-{key}.json"


@functools.lru_cache(maxsize=1)
def _stdlib_documents() -> tuple[tuple[Document, ...], tuple[Document, ...]]:
    """(code, prose) documents of the standard library: from the cache file when there is one, else parsed."""
    cache = _documents_cache_file()
    try:
        stored = json.loads(cache.read_text(encoding="utf-8"))
        return tuple(Document(*d) for d in stored["code"]), tuple(Document(*d) for d in stored["prose"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no cache yet, or one that does not read: parse again
    code, prose = _parse_stdlib_documents()
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        rows = {name: [[d.task, d.origin, d.text] for d in docs] for name, docs in (("code", code), ("prose", prose))}
        atomic_write(cache, lambda tmp: tmp.write_text(json.dumps(rows), encoding="utf-8"))
    except OSError:
        pass  # a read-only home: parse in every process
    return code, prose


def _parse_stdlib_documents() -> tuple[tuple[Document, ...], tuple[Document, ...]]:
    code, prose = [], []
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in _stdlib_files():
        origin = str(path.relative_to(root))
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        nodes = list(ast.walk(tree))  # one walk (half the parse time): stripping docstrings adds no function
        for i, doc in enumerate(_strip_docstrings(nodes)):
            text = " ".join(doc.split())
            if len(text) >= 120:
                prose.append(Document("prose", f"{origin}#{i}", text))
        # One document per function or method: prompts then open on a signature, and no module dominates.
        functions = [n for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for j, node in enumerate(functions):
            chunk = ast.unparse(node)
            if 120 <= len(chunk) <= 4000:
                code.append(Document("code", f"{origin}#{node.name}-{j}", chunk))
    license_file = root / "LICENSE.txt"
    if license_file.exists():
        for k, para in enumerate(license_file.read_text(encoding="utf-8", errors="replace").split("\n\n")):
            text = " ".join(para.split())
            if len(text) >= 120:
                prose.append(Document("prose", f"LICENSE.txt#{k}", text))
    return tuple(code), tuple(prose)


_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Farah", "Goran", "Hana", "Ivo", "Jun", "Kemal", "Lena")
_ITEMS = ("apples", "books", "coins", "marbles", "pencils", "stamps", "cards", "shells", "tickets", "boxes")


def math_problem(rng: random.Random) -> str:
    """One arithmetic word problem with its worked answer."""
    name, other = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    kind = rng.randrange(5)
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    if kind == 0:
        q = f"{name} has {a} {item} and gets {b} more from {other}. How many {item} does {name} have now?"
        w, ans = f"{a} + {b} = {a + b}", a + b
    elif kind == 1:
        a, b = max(a, b), min(a, b)
        q = f"{name} had {a} {item} and gave {b} to {other}. How many {item} are left?"
        w, ans = f"{a} - {b} = {a - b}", a - b
    elif kind == 2:
        a, b = a % 12 + 2, b % 12 + 2
        q = f"{name} buys {a} bags with {b} {item} in each bag. How many {item} is that in total?"
        w, ans = f"{a} * {b} = {a * b}", a * b
    elif kind == 3:
        b = b % 9 + 2
        total = b * (a % 20 + 1)
        q = f"{name} shares {total} {item} equally among {b} friends. How many {item} does each friend get?"
        w, ans = f"{total} / {b} = {total // b}", total // b
    else:
        c = rng.randint(2, 9)
        q = f"{name} has {a} {item}, buys {c} packs of {b % 10 + 1} and loses {c}. How many {item} remain?"
        mid = a + c * (b % 10 + 1)
        w, ans = f"{a} + {c} * {b % 10 + 1} = {mid}, then {mid} - {c} = {mid - c}", mid - c
    return f"Question: {q}\nAnswer: {w}. The answer is {ans}.\n"


def _math_documents(count: int, seed: int) -> list[Document]:
    rng = random.Random(seed)
    return [Document("math", f"math-{seed}-{i}", math_problem(rng)) for i in range(count)]


def documents(task: str, split: str = "train", math_count: int = 4000, seed: int = 0) -> list[Document]:
    """All documents of one task in one split ('train' or 'heldout')."""
    if task not in TASKS:
        from draftsync.errors import DraftsyncError

        raise DraftsyncError(f"unknown task {task!r}", f"use one of {', '.join(TASKS)}")
    if task == "math":
        # Held-out math problems come from another seed: same templates, new numbers and names.
        return _math_documents(
            math_count if split == "train" else max(1, math_count // 10), seed + (0 if split == "train" else 1_000_003)
        )
    code, prose = _stdlib_documents()
    pool = code if task == "code" else prose
    want_held_out = split != "train"
    return [d for d in pool if d.held_out == want_held_out]


def prompts(task: str, count: int, seed: int = 0, split: str = "heldout") -> list[str]:
    """Prompts for traffic and validation: the opening of held-out documents, cut where a model should continue."""
    rng = random.Random(f"{task}-{seed}")
    docs = documents(task, split, seed=seed)
    picked = [docs[rng.randrange(len(docs))] for _ in range(count)]
    out = []
    for doc in picked:
        if task == "math":
            out.append(doc.text.split("Answer:")[0] + "Answer:")
        elif task == "code":
            lines = doc.text.splitlines()
            out.append("\n".join(lines[: max(1, min(3, len(lines) // 2))]) + "\n")
        else:
            words = doc.text.split(" ")
            out.append(" ".join(words[: max(4, min(16, len(words) // 3))]))
    return out


def _check_mix(task_mix: dict[str, float]) -> float:
    total = sum(task_mix.values())
    if total <= 0 or any(t not in TASKS for t in task_mix):
        from draftsync.errors import DraftsyncError

        raise DraftsyncError(f"task mix {task_mix!r} is not usable", f"give positive shares for tasks among {TASKS}")
    return total


def _quotas(task_mix: dict[str, float], count: int, minimum: int = 0) -> dict[str, int]:
    """Stratified: each task gets its exact share of `count`, so the mix holds even for small sets."""
    total = _check_mix(task_mix)
    return {t: max(minimum, int(round(count * task_mix[t] / total))) for t in sorted(task_mix) if task_mix[t] > 0}


def mixed_texts(task_mix: dict[str, float], count: int, seed: int, split: str = "train") -> list[tuple[str, str]]:
    """`count` (task, text) pairs drawn according to `task_mix` (shares are normalised)."""
    rng = random.Random(seed)
    quotas = _quotas(task_mix, count)
    pools = {t: documents(t, split, seed=seed) for t in quotas}
    out = [(t, pools[t][rng.randrange(len(pools[t]))].text) for t in quotas for _ in range(quotas[t])]
    rng.shuffle(out)
    return out


def task_prompts_for_mix(
    task_mix: dict[str, float], count: int, seed: int, split: str = "heldout", distinct: bool = False
) -> list[tuple[str, str]]:
    """About `count` (task, prompt) pairs in the proportions of the task mix, at least one per task.

    `distinct`: each prompt once (the first time it is drawn), so a dataset never stores the target's answer to the
    same prompt twice; asking for more than the documents hold then gives fewer."""
    pairs = [
        (task, p)
        for task, n in _quotas(task_mix, count, minimum=1).items()
        for p in prompts(task, n, seed=seed, split=split)
    ]
    return list(dict.fromkeys(pairs)) if distinct else pairs


def response_prompts(task_mix: dict[str, float], profile: SyncProfile) -> list[tuple[str, str]]:
    """The (task, prompt) pairs a sync's target answers for its dataset, each once: the dataset build and the plan
    that sizes it draw them alike (the training split, at an offset from the texts' seed so the two draws differ)."""
    return task_prompts_for_mix(
        task_mix, profile.generated_samples, seed=profile.seed + 100, split="train", distinct=True
    )


def prompts_for_mix(task_mix: dict[str, float], count: int, seed: int, split: str = "heldout") -> list[str]:
    """The prompts of `task_prompts_for_mix`, without their task names."""
    return [p for _, p in task_prompts_for_mix(task_mix, count, seed, split)]
