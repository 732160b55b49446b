"""Redis ACL users per job: each job's pods authenticate as a user allowed only the job's keys.

Redis 6+ ACLs (https://redis.io/docs/latest/operate/oss_and_stack/management/security/acl/): a
user has passwords, key patterns (``~pattern``) and command categories. A job's user gets

* its keys only: ``~lifeline:<job>:*`` (every key of :class:`~lifeline.catalog.Keys`); no
  Pub/Sub channel;
* every command except the ``@admin`` and ``@dangerous`` categories (no CONFIG, ACL, FLUSHALL,
  KEYS, DEBUG, SHUTDOWN, ...) and except scripting beyond what :class:`~lifeline.catalog.Catalog`
  uses (EVAL/EVALSHA and SCRIPT LOAD/EXISTS of its Lua scripts; no FUNCTION, no SCRIPT FLUSH).

Redis checks the key patterns on every key a command (or a Lua script) touches, so a job's user
can neither read nor write another job's keys; SCAN still lists key *names* (it is not a key
command), never values. Creating or deleting users needs an admin connection (the default user
with the server's password: the operator's, or ``lifeline run``'s).
"""

from __future__ import annotations

from typing import Any

from lifeline.catalog._keys import Keys

__all__ = ["job_user", "job_acl_rules", "COMMANDS"]

COMMANDS = ("+@all", "-@admin", "-@dangerous", "-@scripting", "+eval", "+evalsha", "+script|load",
            "+script|exists")
"""Command rules of every job user, in order (later rules win)."""


def job_user(job: str) -> str:
    """The Redis ACL user of ``job``: ``lifeline-job-<job>``."""
    return f"lifeline-job-{job}"


def job_acl_rules(job: str, password: str) -> list[Any]:
    """The ``ACL SETUSER`` arguments after the user name: reset, on, the password, the job's key
    pattern, no channels, :data:`COMMANDS`.

    Raises:
        ValueError: ``password`` is shorter than 16 characters or contains whitespace.
    """
    if len(password) < 16 or any(c.isspace() for c in password):
        raise ValueError("a job's Redis password must be at least 16 characters without whitespace "
                         "(use secrets.token_hex(32))")
    return ["reset", "on", f">{password}", f"~{Keys(job).pattern}", "resetchannels", *COMMANDS]
