/* zcluster's Redis module: the 2P-set write of lua/write.lua as one native command, for servers that load it
 * (redis-server --loadmodule <path>; `zcluster module` builds it and prints the path).
 *
 *   ZCLUSTER.WRITE numkeys K+ K- [K+ K- ...] op bound mode singles group...
 *   ZCLUSTER.VERSION   -> PROTOCOL, the argument layout this build speaks (a client uses the module only when
 *                         it knows that number: zcluster/_server_module.py)
 *
 * The arguments are the write script's (see lua/write.lua's header) after its SHA, for the calls the module
 * serves: declared keys without floors (mode "0"), no size bound ("0"), op "+" (insert) or "-" (delete)
 * without a wait ("!"). The client sends every other call to the script. The reply is the script's: one
 * character per tuple in ARGV order, "1" took effect and "0" stale; a group whose key is of another kind (an
 * aggregate's hash) stops the call there with "|WRONGTYPE ..." after the verdicts of the tuples done.
 *
 * The rules are the script's, tuple by tuple and in order. An insert of (m, s): stale if K- records m at a
 * score >= s; else it removes that tombstone and adds m to K+, or raises m's score in K+ if s is higher (ZADD
 * GT). A delete of (m, s): stale if K+ records m at a score > s; else it moves m from K+ to K- at s, or
 * raises m's tombstone in K- (ZADD GT). Differences from the script, both to refuse more cleanly: the whole
 * call is checked before anything is written (a malformed count or a score that is not a number is an error
 * and nothing is applied), and a group's two keys are checked for their kind before its first tuple (the
 * script could remove a tombstone before finding K+ of another kind).
 *
 * Every change is replicated as the plain command it amounts to (ZADD K s m with the client's own text of s,
 * ZREM K m), wrapped by the server with the call's other changes: replicas and the AOF never need the module.
 * Every change publishes its keyspace notification (zadd, zrem) as the commands would: a migration's listener
 * learns of these writes as of any other.
 */
#include <string.h>

#include "abi.h"

#define PROTOCOL 1
#define NOTIFY_ZSET (1 << 7)
#define WRONGTYPE "|WRONGTYPE Operation against a key holding the wrong kind of value"

static int (*RM_NotifyKeyspaceEvent)(RedisModuleCtx *, int, const char *, RedisModuleString *);

/* One change, replicated and published. */
static void added(RedisModuleCtx *ctx, RedisModuleString *key, RedisModuleString *score, RedisModuleString *m) {
    RM_Replicate(ctx, "ZADD", "sss", key, score, m);
    RM_NotifyKeyspaceEvent(ctx, NOTIFY_ZSET, "zadd", key);
}

static void removed(RedisModuleCtx *ctx, RedisModuleString *key, RedisModuleString *m) {
    RM_Replicate(ctx, "ZREM", "ss", key, m);
    RM_NotifyKeyspaceEvent(ctx, NOTIFY_ZSET, "zrem", key);
}

static int is_text(RedisModuleString *s, const char *want) {
    size_t len;
    const char *p = RM_StringPtrLen(s, &len);
    return len == strlen(want) && memcmp(p, want, len) == 0;
}

static int keys_of(RedisModuleString **argv, int argc, long long *numkeys) {
    return argc >= 2 && RM_StringToLongLong(argv[1], numkeys) == RM_OK && *numkeys >= 0 && *numkeys <= argc - 2;
}

/* The groups' tuple counts, checked against the arguments: the number of tuples, or -1 (and *why set). */
static long long tuples_of(RedisModuleString **a, int na, long long groups, long long singles, const char **why) {
    long long pos = 4, n = 0;
    for (long long g = 0; g < groups; g++) {
        long long count = 1;
        if (g >= singles) {
            if (pos >= na || RM_StringToLongLong(a[pos], &count) != RM_OK || count < 0) {
                *why = "ERR zcluster.write: a group's tuple count is missing or not a count";
                return -1;
            }
            pos++;
        }
        if (count > (na - pos) / 2) {
            *why = "ERR zcluster.write: a group has fewer tuples than its count";
            return -1;
        }
        pos += 2 * count;
        n += count;
    }
    if (pos != na) {
        *why = "ERR zcluster.write: arguments past the last group";
        return -1;
    }
    return n;
}

static int write_command(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    long long numkeys;
    if (RM_IsKeysPositionRequest(ctx)) {
        if (keys_of(argv, argc, &numkeys))
            for (int i = 0; i < numkeys; i++) RM_KeyAtPos(ctx, 2 + i);
        return RM_OK;
    }
    if (!keys_of(argv, argc, &numkeys) || argc - 2 - numkeys < 4) return RM_WrongArity(ctx);
    RedisModuleString **keys = argv + 2, **a = argv + 2 + numkeys;
    int na = argc - 2 - (int)numkeys;
    int insert = is_text(a[0], "+");
    if (!insert && !is_text(a[0], "-"))
        return RM_ReplyWithError(ctx, "ERR zcluster.write: op must be + or - (a wait's ! goes to the script)");
    if (!is_text(a[1], "0") || !is_text(a[2], "0"))
        return RM_ReplyWithError(ctx, "ERR zcluster.write: only unbounded calls of declared keys (bound 0, mode 0)");
    long long singles, groups = numkeys / 2;
    if (numkeys % 2) return RM_ReplyWithError(ctx, "ERR zcluster.write: keys come in pairs (K+, K-)");
    if (RM_StringToLongLong(a[3], &singles) != RM_OK || singles < 0 || singles > groups)
        return RM_ReplyWithError(ctx, "ERR zcluster.write: singles must be a count of groups");
    const char *why = NULL;
    long long n = tuples_of(a, na, groups, singles, &why);
    if (n < 0) return RM_ReplyWithError(ctx, why);

    /* Every score parsed before anything is written: a bad one refuses the call whole. */
    double *scores = RM_Alloc((size_t)(n ? n : 1) * sizeof(double));
    char *out = RM_Alloc((size_t)n + sizeof(WRONGTYPE));
    long long pos = 4, t = 0;
    for (long long g = 0; g < groups; g++) {
        long long count = 1;
        if (g >= singles) RM_StringToLongLong(a[pos++], &count);
        for (long long j = 0; j < count; j++, pos += 2, t++) {
            if (RM_StringToDouble(a[pos], &scores[t]) != RM_OK) {
                RM_Free(scores);
                RM_Free(out);
                return RM_ReplyWithError(ctx, "ERR zcluster.write: a score is not a valid float");
            }
        }
    }

    size_t done = 0;
    pos = 4;
    t = 0;
    for (long long g = 0; g < groups; g++) {
        long long count = 1;
        if (g >= singles) RM_StringToLongLong(a[pos++], &count);
        if (count == 0) continue;
        RedisModuleString *kadd = keys[2 * g], *krem = keys[2 * g + 1];
        RedisModuleKey *adds = RM_OpenKey(ctx, kadd, RM_READ | RM_WRITE);
        RedisModuleKey *rems = RM_OpenKey(ctx, krem, RM_READ | RM_WRITE);
        int ta = RM_KeyType(adds), tr = RM_KeyType(rems);
        if ((ta != RM_KEYTYPE_EMPTY && ta != RM_KEYTYPE_ZSET) || (tr != RM_KEYTYPE_EMPTY && tr != RM_KEYTYPE_ZSET)) {
            RM_CloseKey(adds);
            RM_CloseKey(rems);
            memcpy(out + done, WRONGTYPE, sizeof(WRONGTYPE) - 1);
            done += sizeof(WRONGTYPE) - 1;
            break;
        }
        /* The set a tuple is judged by (an insert's K-, a delete's K+) and the one it writes. */
        RedisModuleKey *other = insert ? rems : adds, *own = insert ? adds : rems;
        RedisModuleString *kother = insert ? krem : kadd, *kown = insert ? kadd : krem;
        int judged = (insert ? tr : ta) == RM_KEYTYPE_ZSET;
        for (long long j = 0; j < count; j++, pos += 2, t++) {
            RedisModuleString *stext = a[pos], *m = a[pos + 1];
            double s = scores[t], rec;
            char verdict = '0';
            if (judged && RM_ZsetScore(other, m, &rec) == RM_OK) {
                /* m is recorded in the other set (never in both): that record decides; ties go to the delete */
                if (insert ? s > rec : s >= rec) {
                    if (insert) {
                        RM_ZsetRem(other, m, NULL);
                        removed(ctx, kother, m);
                        RM_ZsetAdd(own, s, m, NULL);
                        added(ctx, kown, stext, m);
                    } else { /* the tombstone first, as the script does */
                        RM_ZsetAdd(own, s, m, NULL);
                        added(ctx, kown, stext, m);
                        RM_ZsetRem(other, m, NULL);
                        removed(ctx, kother, m);
                    }
                    verdict = '1';
                }
            } else {
                int flags = RM_ZADD_GT;
                if (RM_ZsetAdd(own, s, m, &flags) == RM_OK && (flags & (RM_ZADD_ADDED | RM_ZADD_UPDATED))) {
                    added(ctx, kown, stext, m);
                    verdict = '1';
                }
            }
            out[done++] = verdict;
        }
        RM_CloseKey(adds);
        RM_CloseKey(rems);
    }
    RM_ReplyWithStringBuffer(ctx, out, done);
    RM_Free(scores);
    RM_Free(out);
    return RM_OK;
}

static int version_command(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    if (argc != 1) return RM_WrongArity(ctx);
    return RM_ReplyWithLongLong(ctx, PROTOCOL);
}

static int notify_api(RedisModuleCtx *ctx) {
    RedisModuleGetApiFunc get = (RedisModuleGetApiFunc)((void **)ctx)[0];
    if (get("RedisModule_NotifyKeyspaceEvent", (void *)&RM_NotifyKeyspaceEvent) == RM_OK) return RM_OK;
    return get("ValkeyModule_NotifyKeyspaceEvent", (void *)&RM_NotifyKeyspaceEvent);
}

static int on_load(RedisModuleCtx *ctx) {
    if (zc_bind_api(ctx) != RM_OK || notify_api(ctx) != RM_OK) return RM_ERR;
    if (RM_IsModuleNameBusy("zcluster")) return RM_ERR;
    RM_SetModuleAttribs(ctx, "zcluster", 1, RM_APIVER_1);
    if (RM_CreateCommand(ctx, "zcluster.version", version_command, "readonly fast", 0, 0, 0) != RM_OK) return RM_ERR;
    return RM_CreateCommand(ctx, "zcluster.write", write_command, "write deny-oom getkeys-api", 0, 0, 0);
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    return on_load(ctx);
}

int ValkeyModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    return on_load(ctx);
}
