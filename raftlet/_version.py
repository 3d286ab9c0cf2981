"""The release of raftlet: the one place the package takes it from (pyproject.toml reads
it). The deploy files name their image by it too (deploy/docker, deploy/k8s): change them
with it."""

__version__ = "0.3.0"
