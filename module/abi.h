/* The part of the Redis module ABI that zcluster_module.c uses: opaque handles, the constants it passes, and the
 * functions it asks the server for by name at load time. Declared here from the module API's documented
 * contract (https://redis.io/docs/latest/develop/reference/modules/modules-api-ref/), so that building the
 * module needs no server source tree. Valkey serves the same ABI. */
#ifndef ZCLUSTER_MODULE_ABI_H
#define ZCLUSTER_MODULE_ABI_H

#include <stddef.h>

#define RM_OK 0
#define RM_ERR 1
#define RM_APIVER_1 1

#define RM_READ (1 << 0)
#define RM_WRITE (1 << 1)

#define RM_KEYTYPE_EMPTY 0
#define RM_KEYTYPE_ZSET 5

#define RM_KEYTYPE_HASH 3

#define RM_HASH_NONE 0

#define RM_REPLY_ERROR 1

#define RM_ZADD_ADDED (1 << 2)
#define RM_ZADD_UPDATED (1 << 3)
#define RM_ZADD_GT (1 << 5)

typedef struct RedisModuleCtx RedisModuleCtx;
typedef struct RedisModuleKey RedisModuleKey;
typedef struct RedisModuleString RedisModuleString;
typedef struct RedisModuleCallReply RedisModuleCallReply;
typedef int (*RedisModuleCmdFunc)(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);

/* Each entry: its return type, its name after the "RedisModule_" prefix, its parameters. */
#define ZC_API(X)                                                                                                 \
    X(void, SetModuleAttribs, (RedisModuleCtx *, const char *, int, int))                                        \
    X(int, IsModuleNameBusy, (const char *))                                                                     \
    X(int, CreateCommand, (RedisModuleCtx *, const char *, RedisModuleCmdFunc, const char *, int, int, int))     \
    X(RedisModuleKey *, OpenKey, (RedisModuleCtx *, RedisModuleString *, int))                                   \
    X(void, CloseKey, (RedisModuleKey *))                                                                        \
    X(int, KeyType, (RedisModuleKey *))                                                                          \
    X(int, ZsetAdd, (RedisModuleKey *, double, RedisModuleString *, int *))                                      \
    X(int, ZsetScore, (RedisModuleKey *, RedisModuleString *, double *))                                         \
    X(int, ZsetRem, (RedisModuleKey *, RedisModuleString *, int *))                                              \
    X(int, StringToDouble, (const RedisModuleString *, double *))                                                \
    X(int, StringToLongLong, (const RedisModuleString *, long long *))                                           \
    X(const char *, StringPtrLen, (const RedisModuleString *, size_t *))                                         \
    X(int, ReplyWithLongLong, (RedisModuleCtx *, long long))                                                     \
    X(int, ReplyWithError, (RedisModuleCtx *, const char *))                                                     \
    X(int, ReplyWithStringBuffer, (RedisModuleCtx *, const char *, size_t))                                      \
    X(int, WrongArity, (RedisModuleCtx *))                                                                       \
    X(int, Replicate, (RedisModuleCtx *, const char *, const char *, ...))                                       \
    X(int, IsKeysPositionRequest, (RedisModuleCtx *))                                                            \
    X(void, KeyAtPos, (RedisModuleCtx *, int))                                                                   \
    X(int, ZsetIncrby, (RedisModuleKey *, double, RedisModuleString *, int *, double *))                         \
    X(int, HashGet, (RedisModuleKey *, int, ...))                                                                \
    X(int, HashSet, (RedisModuleKey *, int, ...))                                                                \
    X(int, SetExpire, (RedisModuleKey *, long long))                                                             \
    X(RedisModuleString *, CreateString, (RedisModuleCtx *, const char *, size_t))                               \
    X(RedisModuleString *, CreateStringFromLongLong, (RedisModuleCtx *, long long))                              \
    X(void, AutoMemory, (RedisModuleCtx *))                                                                      \
    X(RedisModuleCallReply *, Call, (RedisModuleCtx *, const char *, const char *, ...))                         \
    X(int, CallReplyType, (RedisModuleCallReply *))                                                             \
    X(int, GetServerVersion, (void))                                                                      \
    X(int, NotifyKeyspaceEvent, (RedisModuleCtx *, int, const char *, RedisModuleString *))                      \
    X(void *, Alloc, (size_t))                                                                                   \
    X(void, Free, (void *))

#define ZC_DECLARE(ret, name, params) static ret(*RM_##name) params;
ZC_API(ZC_DECLARE)
#undef ZC_DECLARE

/* The server hands a module its API lookup as the first field of the load context: name -> function. */
typedef int (*RedisModuleGetApiFunc)(const char *name, void *out);

/* Fetch every function of ZC_API; RM_ERR (and the module does not load) if the server lacks one. Valkey
 * names its functions "ValkeyModule_..." and may keep the old names: either is taken. */
static int zc_bind_api(RedisModuleCtx *ctx) {
    RedisModuleGetApiFunc get = (RedisModuleGetApiFunc)((void **)ctx)[0];
#define ZC_BIND(ret, name, params)                                                                              \
    if (get("RedisModule_" #name, (void *)&RM_##name) != RM_OK && get("ValkeyModule_" #name, (void *)&RM_##name) != RM_OK) \
        return RM_ERR;
    ZC_API(ZC_BIND)
#undef ZC_BIND
    return RM_OK;
}

#endif
