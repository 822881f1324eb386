"""The HunyuanVideo and SkyReels-I2V smokes' hooks (the rows' ``Smoke``): upstream's recipe shrunk,
on tiny models, with the VideoAlign reward.

``train_grpo_hunyuan.py`` runs the FLUX trainer's loop: steps 1..--max_train_steps, and
``checkpoint-<step>-0`` saved at the *start* of a step whose number is a multiple of
--checkpointing_steps (it holds the weights of the step before).  The smoke passes the FLUX
smoke's checks on what the run wrote (metrics.jsonl; the last checkpoint loads with diffusers'
``HunyuanVideoTransformer3DModel.from_pretrained``, the class the released weights load with,
and moved further than weight decay alone moves it) and, at more than one rank, that every rank
holds the same weights (--weights_digest).

The reward is VideoAlign's, a tiny Qwen2-VL checkpoint laid out as upstream loads it
(trainers.hunyuan.videoalign), scoring each video as decoded (the port's default; upstream's mp4
read back with --reward_from_mp4).  Videos are 5 frames of 64x64 (2 latent frames of 8x8).
"""

from __future__ import annotations

from dancegrpo_npu.smoke.checks import check_full_checkpoint, decay_budget


def arguments(project, built, options, spec) -> tuple[str, ...]:
    """Upstream's recipe (finetune_hunyuan_grpo.sh; finetune_skyreels_i2v.sh with the row's
    ``first_frame``) shrunk: --steps steps of 5 frames at 64x64, 4 sampling steps, one update a
    step, on the tiny models and the tiny VideoAlign.  HunyuanVideo trains every generation
    (best-of-n of all of them) on VideoAlign's VQ; SkyReels-I2V samples with CFG 5.0 against the
    empty prompt, from a first frame the tiny FLUX makes, on MQ."""
    skyreels = spec.smoke.param("first_frame")
    model_dir, data_json = ((built.skyreels_model_dir, built.skyreels_data_json) if skyreels
                            else (built.model_dir, built.data_json))
    common = (
        "--seed", "42",
        "--model_type", "hunyuan_hf",
        "--pretrained_model_name_or_path", str(model_dir),
        "--vae_model_path", str(model_dir),
        "--data_json_path", str(data_json),
        "--gradient_checkpointing",
        "--train_batch_size", "1",
        "--sp_size", "1",
        "--train_sp_batch_size", "1",
        "--dataloader_num_workers", "0",
        "--gradient_accumulation_steps", str(options.generations),
        "--max_train_steps", str(options.steps),
        "--learning_rate", "1e-3",
        "--mixed_precision", "bf16",
        "--checkpointing_steps", str(options.checkpointing_steps or options.steps),
        "--allow_tf32",
        "--cfg", "0.0",
        "--h", "64", "--w", "64", "--t", "5",
        "--sampling_steps", "4",
        "--lr_warmup_steps", "0",
        "--fps", "8",
        "--sampler_seed", "1237",
        "--max_grad_norm", "1.0",
        "--weight_decay", "0.0001",
        "--num_generations", str(options.generations),
        "--use_group",
        "--use_videoalign",
        "--videoalign_ckpt", str(built.videoalign_ckpt),
        "--videoalign_base_model", str(built.videoalign_base),
        "--timestep_fraction", "0.6",
        "--weights_digest",
    )  # fmt: skip
    if skyreels:
        return common + (
            "--reference_model_path", str(built.flux_dir),
            "--empty_embeddings_dir", str(built.skyreels_empty_dir),
            "--eta", "0.3",
            "--shift", "7",
            "--cfg_infer", "5.0",
            # each generation its own initial latent (upstream's recipe shares one with --init_same_noise), as
            # for HunyuanVideo below
        )  # fmt: skip
    return common + (
        "--eta", "0.25",
        "--shift", "5",
        # each generation its own initial latent (upstream's recipe shares one with --use_same_noise): the tiny
        # model's videos from one latent differ too little for the tiny VideoAlign's bfloat16 score to tell apart
        "--bestofn", str(options.generations),
        "--vq_coef", "1.0",
        "--mq_coef", "0.0",
    )  # fmt: skip


def fixtures(project, options, spec):
    """The tiny HunyuanVideo and SkyReels-I2V pipelines, their datasets, the tiny FLUX and the tiny
    VideoAlign (built once for both rows, reused), encoded from the shared fixtures' prompts."""
    from dancegrpo_npu.run.depsets import python_for
    from dancegrpo_npu.smoke.fixtures import build_reward_fixtures
    from dancegrpo_npu.trainers.hunyuan.fixtures import build_hunyuan_fixtures

    prompts = build_reward_fixtures(project.build_dir / "fixtures-reward").prompts
    return build_hunyuan_fixtures(project.build_dir / "fixtures-hunyuan", prompts,
                                  python_for(spec.depset, needed_by=spec.name), project.workdir)


def checkpoint(run_dir, built, options, spec, args):
    """The last checkpoint, against the row's model: SkyReels-I2V's where it makes a first frame."""
    model_dir = built.skyreels_model_dir if spec.smoke.param("first_frame") else built.model_dir
    return check_full_checkpoint(run_dir / "outputs", model_dir, options.steps, decay_budget(args, options.steps),
                                 spec.smoke.model_class)
