/* rotate: `moongate rotate-encryption-key` on a cluster (cluster.postgres). The control
 * plane's truth is PostgreSQL's control_log (admin/control.h), so the rotation is made there:
 * under the writers' advisory lock (MG_CONTROL_LOCK), every provider whose last entry is a
 * 'put' of a stored key (source 'db') gets a new 'put' of its row with the key re-encrypted
 * under the new key, all in one PostgreSQL transaction (all or nothing), then NOTIFY. Every
 * instance, this one included, applies those rows through its follower (or when it starts),
 * and its next generation decrypts them with the key it holds. No SQLite is written here. */
#ifndef MG_CLUSTER_ROTATE_H
#define MG_CLUSTER_ROTATE_H

#include <stddef.h>

#include "base/secret.h"

/* url: cluster.postgres.url (a secret: never in err); node: the entries' node. *count: the
 * keys re-encrypted. 0, or -1 with err set (nothing changed). */
int mg_cluster_rotate_providers(const char *url, const char *node, const mg_secret_key_t *old_key,
                                const mg_secret_key_t *new_key, size_t *count, char *err,
                                size_t errlen);

#endif
