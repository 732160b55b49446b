"""lifeline.catalog: the job's catalog in Redis, the only owner of every key and document.

* :class:`Catalog` - registry and heartbeats, holdings per (step, rank, tier), the latest
  complete step, persistence commits, corruption reports, recovery plans and generations,
  trainer progress, rendezvous addresses, upstream-log coverage, ownership and wipe; the job's
  Redis ACL user (:meth:`Catalog.grant_job_user`, :func:`job_user`).
* :class:`CatalogView` - what a runner reads each round (:meth:`Catalog.view`).
* the documents: :class:`SidecarRegistration`, :class:`ProgressReport`,
  :class:`CorruptionReport`, :class:`LogCoverage`, :class:`PersistedWindows` (recovery plans are
  :class:`lifeline.api.recovery.RecoveryPlan`).

The key names are in :mod:`lifeline.catalog._keys`; nothing outside this part spells one.
"""

from lifeline.catalog._acl import job_user
from lifeline.catalog._catalog import Catalog, CatalogView
from lifeline.catalog._keys import Keys
from lifeline.catalog.documents import (
    CorruptionReport,
    LogCoverage,
    PersistedWindows,
    ProgressReport,
    SidecarRegistration,
)

__all__ = ["Catalog", "CatalogView", "CorruptionReport", "Keys", "LogCoverage", "PersistedWindows",
           "ProgressReport", "SidecarRegistration", "job_user"]
