/* sqlq: a WHERE clause from the filters given; see sqlq.h. */
#include "store/sqlq.h"

#include <stdio.h>
#include <string.h>

static void put(mg_sqlq_t *q, const char *s, size_t n)
{
    if (q->overflow || q->len + n >= sizeof(q->sql)) {
        q->overflow = 1;
        return;
    }
    memcpy(q->sql + q->len, s, n);
    q->len += n;
    q->sql[q->len] = '\0';
}

void mg_sqlq_init(mg_sqlq_t *q, const char *head)
{
    memset(q, 0, sizeof(*q));
    put(q, head, strlen(head));
}

/* text with each '?' numbered as one new parameter bound to value */
static void put_bound(mg_sqlq_t *q, const char *text, const char *value)
{
    for (const char *p = text; *p;) {
        const char *m = strchr(p, '?');
        if (!m) {
            put(q, p, strlen(p));
            break;
        }
        put(q, p, (size_t)(m - p));
        if (q->nparams >= MG_SQLQ_PARAMS || !value) {
            q->overflow = 1; /* no room, or a '?' without a value: never run it */
            return;
        }
        q->params[q->nparams++] = value;
        char num[16];
        int n = snprintf(num, sizeof(num), "?%d", q->nparams);
        put(q, num, (size_t)n);
        p = m + 1;
    }
}

void mg_sqlq_and(mg_sqlq_t *q, const char *term, const char *value)
{
    const char *join = q->terms++ ? " AND " : " WHERE ";
    put(q, join, strlen(join));
    put_bound(q, term, value);
}

void mg_sqlq_tail(mg_sqlq_t *q, const char *text, const char *value)
{
    put_bound(q, text, value);
}

int mg_sqlq_ok(const mg_sqlq_t *q)
{
    return !q->overflow;
}
