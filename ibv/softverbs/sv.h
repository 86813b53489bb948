/* softverbs internals: a userspace libibverbs.so.1 with software RoCE/IB devices (one by
 * default) whose RC queue pairs talk over UDP (see README.md). */
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
/* SV_V11 makes name@@IBVERBS_1.1 the default version of a call that also has an IBVERBS_1.0
 * entry point (compat.c); put it in the file that defines the call. */
#define SV_V11(name) __asm__(".symver " #name ", " #name "@@@IBVERBS_1.1")

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
	SV_VENDOR_ID = 0x5356,     /* "SV": no IEEE OUI, a made-up vendor as software devices use */
	SV_VENDOR_PART_ID = 1,
};

struct sv_config {
	int ib;               /* link layer InfiniBand instead of Ethernet */
	int roce_v1_only;     /* Ethernet: the RoCE v2 entries (1, 3) empty, as a v1-only NIC */
	int roce_v2_only;     /* Ethernet: RoCE v2 entries only, one per address: 0 fe80::, 1 IPv4 */
	enum ibv_mtu active_mtu;
	int64_t min_ack_ns;   /* floor of the local ACK timeout */
	int samehost;         /* RC payloads to a peer on this host move by process_vm_readv */
	int64_t poll_hold_ns; /* the progress thread leaves the sockets to a busy poller this long */
	char ctl[256];        /* fault control file, watched */
};

/* Faults of one device, set from the environment at load and from the control file. */
struct sv_faults {
	int port_down;
	int fatal;
	int rtr_delay_ms;
	int rtr_fail;    /* errno for INIT->RTR, 0 = none */
	int drop_pct;    /* outgoing packets dropped, percent */
};

/* Device statistics, as a NIC's hw_counters (ibv_read_sysfs_file of
 * <ibdev_path>/ports/1/hw_counters/<name>); sv_counter_names holds the names. */
enum sv_counter {
	SV_CNT_TX_PACKETS,
	SV_CNT_RX_PACKETS,
	SV_CNT_TX_DROPPED,      /* not sent: port down, device dead, drop_pct */
	SV_CNT_RX_DROPPED,      /* received while the port was down or the device dead */
	SV_CNT_RNR_NAK_SENT,
	SV_CNT_RNR_NAK_RECV,
	SV_CNT_SEQ_NAK_SENT,
	SV_CNT_SEQ_NAK_RECV,
	SV_CNT_DUPLICATE,       /* duplicate requests, ACKed again and not placed */
	SV_CNT_ACK_TIMEOUT,     /* local ACK timer expiries with packets outstanding */
	SV_CNT_RETRY_EXC,       /* WQEs completed with RETRY_EXC_ERR */
	SV_CNT_RNR_RETRY_EXC,   /* WQEs completed with RNR_RETRY_EXC_ERR */
	SV_CNT_SAMEHOST_TX,     /* packets sent as references to the payload (SV_FLAG_REF) */
	SV_CNT_SAMEHOST_RX,     /* payloads read from the sending process */
	SV_CNT_SAMEHOST_REFUSED, /* references that could not be read (answered SV_NAK_NOREF) */
	SV_NCNT
};
extern const char *const sv_counter_names[SV_NCNT];

enum { SV_MAX_DEVICES = 16 };

/* One device: one port, its own address, GID table, faults and statistics. Written at load,
 * then only its faults (under sv_glock, fields stored atomically so that the packet path may
 * read them without the lock), its generations and its counters change. */
struct sv_dev {
	struct ibv_device dev; /* what ibv_get_device_list hands out */
	int index;
	int phantom;           /* a NIC with no cable: its port is always DOWN */
	uint8_t ip[4];         /* the port's IPv4 address */
	uint16_t lid;          /* IB mode */
	uint64_t guid;         /* node GUID, host order */
	struct sv_faults faults;
	uint32_t fatal_gen;    /* bumped each time the device turns fatal */
	uint32_t port_gen;     /* bumped at each port state change */
	uint64_t cnt[SV_NCNT];
};

extern struct sv_config sv_cfg;
extern pthread_mutex_t sv_glock;
extern struct sv_dev sv_devs[SV_MAX_DEVICES];
extern int sv_ndevs;

struct sv_gid {
	union ibv_gid gid;
	enum ibv_gid_type type;
	int valid;
};

/* sv_gid_at fills the GID table entry index of d; 0, EINVAL (out of range) or ENODATA (empty). */
int sv_gid_at(const struct sv_dev *d, unsigned index, struct sv_gid *out);
/* sv_gid_ipv4 resolves a GID to the IPv4 address its packets go to; 0 or -1. */
int sv_gid_ipv4(const union ibv_gid *g, uint8_t ip[4]);
int sv_gid_is_v4mapped(const union ibv_gid *g);
void sv_faults_snapshot(const struct sv_dev *d, struct sv_faults *f);
int64_t sv_now_ns(void);
void sv_global_init(void);
void sv_ctl_reload(void);
/* sv_dev_of is the softverbs device behind an ibv_device, or NULL. */
struct sv_dev *sv_dev_of(const struct ibv_device *d);
/* sv_dev_port_down: the port is DOWN now (no cable, administratively down). */
int sv_dev_port_down(const struct sv_dev *d);
int sv_dev_fatal(const struct sv_dev *d);

static inline void sv_count(struct sv_dev *d, enum sv_counter k)
{
	__atomic_add_fetch(&d->cnt[k], 1, __ATOMIC_RELAXED);
}

#endif
