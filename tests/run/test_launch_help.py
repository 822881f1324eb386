"""launch --help: every trainer's recipe scripts, from the registry, and examples of each kind."""

from __future__ import annotations

from dancegrpo_npu import registry
from dancegrpo_npu.cli import main


def test_the_help_names_every_rows_recipe_scripts_and_shows_a_video_and_an_sd_launch(capsys):
    try:
        main(["launch", "--help"])
    except SystemExit:
        pass
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the option help
    for row in registry.REGISTRY.values():
        if row.recipe_glob:
            assert row.recipe_glob in out, row.name
    examples = [line for line in out.split("dancegrpo-npu launch ")[1:]]
    launched = {words.split()[0] for words in examples if words.split()}
    video = {name for name in registry.trainers() if registry.get(name).per_rank_batch}
    foreign = {name for name in registry.trainers() if registry.get(name).foreign_flags}
    assert launched & video and launched & foreign
