/* softverbs internals: a userspace libibverbs.so.1 with one software RoCE/IB device whose RC
 * queue pairs talk over UDP (see README.md). */
#ifndef SOFTVERBS_SV_H
#define SOFTVERBS_SV_H

#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include "wire.h"

/* verbs.h turns some entry points into macros over inline helpers; the library defines the
 * real functions under their exported names. */
#undef ibv_reg_mr
#undef ibv_reg_mr_iova
#undef ibv_query_port
#undef ibv_get_device_list

#define SV_EXPORT __attribute__((visibility("default")))

enum {
	SV_GID_TBL_LEN = 16,
	SV_MAX_QP_WR = 32768,
	SV_MAX_SGE = 30,
	SV_MAX_CQE = 4194303,
	SV_MAX_INLINE = 1024,
	SV_MAX_RD_ATOM = 16,
	SV_MAX_MSG = 1 << 30,
	SV_WINDOW = 128,           /* packets in flight per QP */
	SV_ACK_EVERY = 32,         /* a responder ACKs every 32nd PSN inside a message */
	SV_PKEY_TBL_LEN_ETH = 1,
	SV_PKEY_TBL_LEN_IB = 128,
};

struct sv_config {
	char name[IBV_SYSFS_NAME_MAX];
	uint8_t ip[4];        /* the port's IPv4 address */
	int ib;               /* link layer InfiniBand instead of Ethernet */
	int roce_v1_only;     /* Ethernet: the RoCE v2 entries (1, 3) empty, as a v1-only NIC */
	uint16_t lid;         /* IB mode */
	enum ibv_mtu active_mtu;
	int64_t min_ack_ns;   /* floor of the local ACK timeout */
	char ctl[256];        /* fault control file, watched */
};

/* Faults, process-wide, set from the environment at load and from the control file. */
struct sv_faults {
	int port_down;
	int fatal;
	int rtr_delay_ms;
	int rtr_fail;    /* errno for INIT->RTR, 0 = none */
	int drop_pct;    /* outgoing packets dropped, percent */
};

extern struct sv_config sv_cfg;
extern pthread_mutex_t sv_glock;
extern struct sv_faults sv_faults;

struct sv_gid {
	union ibv_gid gid;
	enum ibv_gid_type type;
	int valid;
};

/* sv_gid_at fills the GID table entry index; 0, EINVAL (out of range) or ENODATA (empty). */
int sv_gid_at(unsigned index, struct sv_gid *out);
/* sv_gid_ipv4 resolves a GID to the IPv4 address its packets go to; 0 or -1. */
int sv_gid_ipv4(const union ibv_gid *g, uint8_t ip[4]);
int sv_gid_is_v4mapped(const union ibv_gid *g);
void sv_faults_snapshot(struct sv_faults *f);
int64_t sv_now_ns(void);
void sv_global_init(void);
void sv_ctl_reload(void);
struct ibv_device *sv_device(void);
uint64_t sv_node_guid(void);

#endif
