"""The README and docs/: links that resolve, a front page that stays one, a port guide
that names every patch of the series in order, and tool hints that point at real pages."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a '#' in a code block is no heading
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_every_link_resolves():
    broken = []
    for page in [ROOT / "README.md", *DOCS]:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_readme_is_a_front_page_linking_every_guide():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "./scripts/bootstrap.sh" in readme and "./scripts/test.sh" in readme
    for page in DOCS:
        assert f"docs/{page.name}" in readme, f"README does not link docs/{page.name}"


def test_the_readmes_first_paragraph_names_every_trainers_model():
    from dancegrpo_npu import registry
    first = " ".join((ROOT / "README.md").read_text().split("\n\n")[1].split())
    titles = {registry.get(name).title for name in registry.trainers()}
    assert all(title in first for title in titles), (sorted(titles), first)


def test_the_weights_page_names_each_trainers_repository_and_its_place():
    """docs/weights.md: the repository of every trainer's model (Wan's Diffusers layout), under
    the directory launch passes it from; the 910B guide's Weights section links it."""
    from dancegrpo_npu import registry
    page = (ROOT / "docs" / "weights.md").read_text()

    def model_path(script):
        return dict(registry.get(script).defaults)["--model_path"]

    model_dirs = {
        "black-forest-labs/FLUX.1-dev": model_path("preprocess"),
        "Qwen/Qwen-Image": model_path("preprocess-qwenimage"),
        "Qwen/Qwen-Image-Edit": model_path("preprocess-qwenimage-edit"),
        "Wan-AI/Wan2.1-T2V-1.3B-Diffusers": model_path("preprocess-wan"),
        "hunyuanvideo-community/HunyuanVideo": model_path("preprocess-hunyuan"),
        "xzyhku/SkyReels-V1-I2V": model_path("preprocess-skyreels-i2v"),
        "KwaiVGI/VideoReward": dict(registry.get("hunyuan").defaults)["--videoalign_ckpt"],
        "Qwen/Qwen2-VL-2B-Instruct": dict(registry.get("hunyuan").defaults)["--videoalign_base_model"],
    }
    rows = {line.split("|")[2]: line for line in page.splitlines() if line.startswith("| `")}
    for repo, directory in model_dirs.items():
        row = next((line for cell, line in rows.items() if f"[{repo}]" in cell), None)
        assert row is not None and f"`{directory}/`" in row, (repo, directory)
    weights = (ROOT / "docs" / "ascend-910b.md").read_text().split("## Weights")[1].split("\n## ")[0]
    assert "(weights.md)" in weights


def test_the_weights_page_has_a_download_command_for_every_repository_in_its_table():
    """Each repository of the table, downloaded into the directory the table gives it."""
    page = (ROOT / "docs" / "weights.md").read_text()
    code = "\n".join(re.findall(r"```bash\n(.*?)```", page, flags=re.S)).replace("\\\n", " ")
    commands = [" ".join(line.split()) for line in code.splitlines() if " download " in line]
    table = [line.split("|") for line in page.splitlines() if line.startswith("| ") and "](https://huggingface.co/" in line]
    assert len(table) >= 12
    for cells in table:
        repo = re.search(r"\[([^]]+)\]\(https://huggingface.co/", cells[2]).group(1)
        place = re.search(r"`([^`]+)`", cells[3]).group(1).rstrip("/")
        local = place.rsplit("/", 1)[0] if "." in place.rsplit("/", 1)[-1] else place  # a file: its directory
        assert any(re.search(rf"download {re.escape(repo)}( |$)", c) and f"--local-dir {local}" in c
                   for c in commands), (repo, local)


def test_the_dependency_sets_table_names_every_script_under_its_set():
    from dancegrpo_npu import registry
    rows = {line.split("|")[1].strip(" `").split("`")[0]: line for line in
            (ROOT / "docs" / "dependencies.md").read_text().splitlines() if line.startswith("| `diffusers-")}
    for name, spec in registry.REGISTRY.items():
        assert f"`{name}`" in rows[spec.depset], (name, spec.depset)


def test_the_910b_guide_names_every_models_dataset_directory():
    from dancegrpo_npu import registry
    weights = (ROOT / "docs" / "ascend-910b.md").read_text().split("## Weights")[1].split("\n## ")[0]
    datasets = {spec.dataset for spec in registry.REGISTRY.values() if spec.dataset}
    assert datasets and all(f"`{name}/`" in weights for name in datasets), sorted(datasets)


def test_alignment_guide_gives_rng_cpu_to_every_trainer_with_the_seam():
    from dancegrpo_npu import registry
    text = (ROOT / "docs" / "alignment.md").read_text()
    paragraph = text.split("`--rng cpu` (on")[1].split("\n\n")[0]
    assert all(f"`{name}`" in paragraph for name in registry.aligning()), paragraph


def test_port_guide_names_every_patch_in_series_order():
    from dancegrpo_npu.engine.series import patch_stem

    series = [  # by name: the guide does not depend on the numbers
        patch_stem(line.strip())
        for line in (ROOT / "patches" / "series").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    port = (ROOT / "docs" / "port.md").read_text()
    positions = [port.find(f"**{name}**") for name in series]
    missing = [name for name, at in zip(series, positions) if at < 0]
    assert not missing, f"docs/port.md does not describe: {missing}"
    assert positions == sorted(positions), "docs/port.md lists the patches out of series order"


def test_hints_point_at_pages_that_exist():
    named = set()
    for path in [*(ROOT / "src").rglob("*.py"), *(p for p in (ROOT / "scripts").rglob("*") if p.is_file())]:
        named |= set(re.findall(r"docs/[\w.-]+\.md", path.read_text(errors="replace")))
    assert named, "no hint names a docs/ page (the search is broken)"
    missing = sorted(n for n in named if not (ROOT / n).exists())
    assert not missing, missing


def series_length() -> int:
    lines = (ROOT / "patches" / "series").read_text().splitlines()
    return sum(1 for line in lines if line.strip() and not line.startswith("#"))


def test_patch_counts_the_docs_state_are_the_series():
    """A count like "16 of 17 patches" goes stale with every new patch: it must be the series'."""
    stale = []
    for page in [ROOT / "README.md", *DOCS]:
        for kept, total in re.findall(r"\b(\d+) of (\d+) patches", page.read_text()):
            if int(total) != series_length() or int(kept) != series_length() - 1:
                stale.append(f"{page.name}: {kept} of {total} patches (the series has {series_length()})")
    assert not stale, "\n".join(stale)


def test_test_counts_are_stated_with_when_they_were_measured():
    """testing.md must not present two different suite sizes as the present one."""
    text = (ROOT / "docs" / "testing.md").read_text()
    present = re.findall(r"(?:the suite has|has) (\d+) tests now", text)
    assert not present, f"testing.md states the present test count ({present}); it goes stale"


def test_launch_examples_name_the_recipe_the_launch_runs(patched_tree):
    """A documented `launch flux ... --nproc-per-node N  # ... <script>.sh` runs that script's recipe."""
    from dancegrpo_npu.registry import REGISTRY as SCRIPTS
    from dancegrpo_npu.run.recipes import recipes_for

    example = re.compile(r"dancegrpo-npu launch (flux|flux-lora) .*--nproc-per-node (\d+)\s.*#.*?(finetune_\w+\.sh)")
    checked = 0
    for page in [ROOT / "README.md", *DOCS]:
        for script, nproc, named in example.findall(page.read_text()):
            if "--nnodes" in named:
                continue
            info = SCRIPTS[script]
            chosen = [r for r in recipes_for(patched_tree.tree, info.relpath, info.recipe_glob)
                      if r.world_size == int(nproc)]
            assert [r.path.name for r in chosen] == [named], f"{page.name}: launch {script} x{nproc} says {named}"
            checked += 1
    assert checked >= 2


# How the project refers to its own work items: "issue 9", "issues 8 and 10", "defect 4 of ...".
# Other projects' issues keep their number sign ("upstream issue #57"), which this leaves alone.
OWN_ISSUE = re.compile(r"\b(?:issues? \d|defect \d+ of)", re.I)


def test_code_patches_and_docs_speak_of_the_software_only():
    """No issue numbers of this project's tracker, anywhere: they say how the software was built,
    not what it does, and mean nothing to a reader of the code, a patch or a page."""
    paths = [ROOT / "README.md", *DOCS, ROOT / "patches" / "series", *(ROOT / "patches").glob("*.patch")]
    for top in ("src", "overlay", "scripts", "bench", "tests"):
        paths += [p for p in (ROOT / top).rglob("*") if p.is_file() and p.suffix in (".py", ".sh", ".md", ".toml", "")
                  and "__pycache__" not in p.parts]
    found = []
    for path in paths:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OWN_ISSUE.search(line) and path != Path(__file__).resolve():
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not found, "\n".join(found)
