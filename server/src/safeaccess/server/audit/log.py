"""The audit log, moved to `safeaccess.server.store.auditlog` (it runs inside the store's
transactions and reads their session, and SQL lives only in the store). Re-exported here until
the layout change's last step: other branches still import it from here."""

from safeaccess.server.store.auditlog import Entry as Entry
from safeaccess.server.store.auditlog import append as append
from safeaccess.server.store.auditlog import append_many as append_many
from safeaccess.server.store.auditlog import consistency_proof as consistency_proof
from safeaccess.server.store.auditlog import entries as entries
from safeaccess.server.store.auditlog import inclusion_proof as inclusion_proof
from safeaccess.server.store.auditlog import leaf_hashes as leaf_hashes
from safeaccess.server.store.auditlog import logged as logged
from safeaccess.server.store.auditlog import root as root
from safeaccess.server.store.auditlog import size as size
