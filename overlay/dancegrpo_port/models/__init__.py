"""Replacements for upstream and diffusers model code the NPU cannot run as it is."""
