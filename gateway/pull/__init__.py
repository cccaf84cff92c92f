"""`modelyard pull`: a GGUF (and its vision projector) from Hugging Face's hub into the models
folder. spec.py: what was asked for and which files that is; hub.py: the hub's API and one
resumable, digest-checked download; cli.py: the command."""
from gateway.pull.cli import add_pull_arguments, models_dir, pull, run_pull
from gateway.pull.hub import HubError
from gateway.pull.spec import PullError

__all__ = ["HubError", "PullError", "add_pull_arguments", "models_dir", "pull", "run_pull"]
