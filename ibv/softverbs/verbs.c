//go:build ignore

/* softverbs: contexts, PDs, MRs, completion channels, CQs, RC QPs and the progress thread
 * that plays the NIC (see README.md). Locking: a context's lk guards its QPs, MRs, PD
 * counts, async queue and sockets; a CQ's lk its ring; a channel's lk its event queue.
 * Order: context -> CQ -> channel. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <endian.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <ifaddrs.h>
#include "sv.h"

struct sv_ctx;
struct sv_qp;

struct sv_channel {
	struct ibv_comp_channel ch;
	pthread_mutex_t lk;
	struct sv_cq **q;
	int qlen, qcap;
	int signaled;
};

struct sv_cqe {
	struct ibv_wc wc;
	struct sv_qp *qp;
	int is_send;
	uint32_t release; /* the queue index up to which this CQE frees WQE slots */
};

struct sv_cq {
	struct ibv_cq cq;
	struct sv_ctx *ctx;
	pthread_mutex_t lk;
	struct sv_cqe *ring;
	int cap, head, count;
	int armed; /* 0, 1 any, 2 solicited only */
	int err;
	int nqp;
	struct sv_channel *ch;
	uint32_t comp_reported, async_reported; /* events handed out (atomic) */
};

struct sv_pd {
	struct ibv_pd pd;
	int refs;
};

struct sv_mr {
	struct ibv_mr mr;
	struct sv_pd *pd;
	int access;
	uint64_t iova; /* the address remote peers use for mr.addr */
	struct sv_mr *next;
};

struct sv_swqe {
	uint64_t wr_id;
	enum ibv_wr_opcode op;
	int signaled, solicited, imm_valid, fence;
	uint32_t imm;
	uint8_t *data;          /* SEND, WRITE: the data, copied at post time (blk + SV_BLK_HDR) */
	uint8_t *blk;           /* its allocation: the SV_FLAG_REF token (u64), then the data */
	uint32_t len;           /* message length (READ: of the local SGEs; atomics: 8) */
	uint64_t rva;           /* WRITE, READ, atomics: remote address and key */
	uint32_t rkey;
	uint64_t swap, cmp;     /* atomics: swap or add, compare */
	struct ibv_sge *sge;    /* READ, atomics: where the response lands */
	int nsge;
	struct sockaddr_in udest; /* UD: where it goes, its Q_Key and GRH GIDs */
	uint32_t qkey;
	int grh;
	uint8_t sgid[16], dgid[16];
	enum ibv_wc_status pre; /* an error found at post time, reported in order */
	uint32_t first_psn, npkts;
	uint32_t rd_got;        /* READ, atomics: response packets placed */
};

/* sv_is_rd: a READ or an atomic, completed by its responses rather than by an ACK. */
static inline int sv_is_rd(const struct sv_swqe *w)
{
	return w->op == IBV_WR_RDMA_READ || w->op == IBV_WR_ATOMIC_CMP_AND_SWP ||
	       w->op == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

/* The data of a SEND or WRITE WQE follows a header holding its token (SV_FLAG_REF): a
 * receiver on this host reads the payload and then the token, and takes the payload only if
 * the token still holds, so the token is cleared before the data is freed. */
enum { SV_BLK_HDR = 16 };

static void sv_swqe_free(struct sv_swqe *w)
{
	if (w->blk) {
		__atomic_store_n((uint64_t *)w->blk, 0, __ATOMIC_RELEASE);
		free(w->blk);
	}
	w->blk = NULL;
	w->data = NULL;
	free(w->sge);
	w->sge = NULL;
}

enum { SV_ACACHE = 16 }; /* atomic responses kept for duplicate requests (max_dest_rd_atomic) */

struct sv_rwqe {
	uint64_t wr_id;
	int nsge;
	struct ibv_sge *sge;
};

/* An address handle: where a UD message goes (its destination QPN is the WR's). */
struct sv_ah {
	struct ibv_ah ah;
	struct sockaddr_in dest;
	int grh;
	union ibv_gid sgid, dgid;
};

/* A shared receive queue: its QPs take RECVs from it in order, each at the first packet of a
 * message (the slot is free again then). */
struct sv_srq {
	struct ibv_srq srq;
	struct sv_ctx *ctx;
	struct sv_pd *pd;
	struct sv_rwqe *q;
	struct ibv_sge *sge;
	uint32_t cap, max_sge, head, tail;
	uint32_t limit;       /* armed when non-zero: SRQ_LIMIT_REACHED below it */
	int nqp;
	uint32_t ev_reported; /* async events handed out (atomic) */
};

/* A WR the ibv_wr_* API is building (ibv_wr_start .. ibv_wr_complete). */
struct sv_pwr {
	struct ibv_send_wr wr;
	struct ibv_sge sge[SV_MAX_SGE];
	uint8_t *inl; /* inline data, copied at once */
};

struct sv_qp {
	union {
		struct ibv_qp qp;
		struct ibv_qp_ex qpx; /* its first member is the ibv_qp */
	};
	int has_qpx;            /* created by ibv_create_qp_ex with send ops */
	int rq_open, sq_open;   /* posting allowed: RECVs from INIT on, SENDs from RTS on (to RESET) */
	struct sv_pwr *pw;      /* the WRs being built */
	int npw, cappw, pw_err;
	struct sv_ctx *ctx;
	struct sv_cq *scq, *rcq;
	struct sv_pd *pd;
	int fd;
	struct ibv_qp_cap cap;
	int sq_sig_all;
	enum ibv_qp_state state;
	struct ibv_qp_attr attr;
	struct sockaddr_in dest;
	uint32_t mtu_bytes;

	struct sv_swqe *sq;
	uint32_t sq_cap, sq_tail, sq_done, sq_send, sq_pkt, sq_released;
	uint32_t next_psn, acked_psn;
	int64_t ack_deadline, resume_at;
	int retries, rnr_retries;

	struct sv_rwqe *rq;
	struct ibv_sge *rq_sge;
	uint32_t rq_cap, rq_tail, rq_head, rq_released;
	uint32_t epsn, msg_off;
	int in_msg, nak_sent;
	int msg_write, msg_imm;   /* the message in progress is an RDMA WRITE (with immediate) */
	uint8_t *wr_ptr;          /* WRITE: where it lands, and its length */
	uint32_t wr_len;
	struct {
		uint32_t psn;
		int valid;
		uint64_t orig;
	} acache[SV_ACACHE];
	int acache_next;

	struct sv_srq *srq;      /* RECVs from this SRQ instead of rq */
	struct sv_rwqe srq_cur;  /* the SRQ RECV the message in progress uses */
	struct ibv_sge *srq_cur_sge;
	int srq_have;

	int samehost;         /* RC to a peer on this host: payloads go as SV_FLAG_REF */
	int ack_due;          /* an ACK of ack_psn leaves once sv_rx is through the batch */
	uint32_t ack_psn;
	int overrun;
	uint32_t ev_reported; /* async events handed out (atomic) */
	struct sv_qp *next;
};

static void sv_pw_clear(struct sv_qp *q);

struct sv_async {
	enum ibv_event_type type;
	void *elem;
	int port;
};

#define SV_MR_BUCKETS 256
#define SV_NQPN 65536

struct sv_ctx {
	struct verbs_context vctx;
	pthread_mutex_t lk;
	int epfd, wakefd;
	pthread_t thr;
	int stop;
	int64_t sleep_until; /* the progress thread sleeps until then; 0 while it runs */
	/* A consumer that busy-polls an empty CQ reads the context's sockets itself
	 * (sv_poll_cq). While it does, the progress thread leaves the sockets to it and waits
	 * only for its timers and wakefd: were both on the sockets, every packet would also
	 * wake the thread, a context switch per packet on the cores the pollers spin on. */
	int64_t poll_ns;  /* when a consumer last read the sockets from sv_poll_cq */
	int poll_streak;  /* how many times it did for an unarmed CQ since a CQ of the context was last armed */
	int leave_rx;     /* the thread is waiting with the sockets left to the pollers */
	struct sv_txb *txb; /* the packets sv_pump is sending, NULL until the first pump */
	struct sv_rxs *rxs; /* what sv_rx works with, NULL until the first */
	int txb_on;         /* sv_pump is running: packets go into txb */
	struct sv_qp **qps;  /* by QPN (the UDP port) */
	struct sv_qp *qlist;
	struct sv_mr *mrs[SV_MR_BUCKETS];
	uint32_t next_key;
	struct sv_async *aq;
	int aqlen, aqcap, asig;
	struct sv_dev *dev;
	int port_down, fatal;          /* as this context last saw them (events), fatal latched */
	uint32_t fatal_gen, port_gen;  /* the device's generations this context has seen */
	unsigned rnd;
	uint32_t pid;       /* SV_FLAG_REF: this process, and the next token's seed */
	uint64_t tok_next;
};

enum { SV_WAKE_ID = 0 };
#define SV_POLL_STREAK 16             /* empty polls in a row that make a busy poller */
/* how long the thread leaves the sockets to a busy poller after its last poll:
 * SOFTVERBS_POLL_HOLD_US, default 1 ms; 0 never leaves them */
#define SV_POLL_HOLD_NS (sv_cfg.poll_hold_ns)

static void sv_rx(struct sv_ctx *c, const struct epoll_event *evs, int n, int thread);

static inline struct sv_ctx *sv_ctx(struct ibv_context *c)
{
	return (struct sv_ctx *)((char *)c - offsetof(struct sv_ctx, vctx.context));
}

/* sv_dead: the device died (fatal) since this context was opened; it stays dead even when
 * the device comes back for new contexts. Read live, as the NIC's state. */
static int sv_dead(struct sv_ctx *c)
{
	return c->fatal || sv_dev_fatal(c->dev) ||
	       __atomic_load_n(&c->dev->fatal_gen, __ATOMIC_ACQUIRE) != c->fatal_gen;
}

/* sv_port_active: the port passes packets now (the device's live state: a context learns of
 * a change through its async events later, as from a NIC). */
static int sv_port_active(struct sv_ctx *c)
{
	return !sv_dev_port_down(c->dev) && !sv_dead(c);
}

/* ---- async events ---- */

static void sv_evfd_set(int fd)
{
	uint64_t one = 1;
	if (write(fd, &one, sizeof(one)) < 0) {
		/* the counter cannot overflow at 1; nothing to do */
	}
}

static void sv_evfd_clear(int fd)
{
	uint64_t v;
	if (read(fd, &v, sizeof(v)) < 0) {
		/* already clear */
	}
}

static void sv_async_push(struct sv_ctx *c, enum ibv_event_type type, void *elem, int port)
{
	if (c->aqlen == c->aqcap) {
		int n = c->aqcap ? c->aqcap * 2 : 16;
		struct sv_async *a = realloc(c->aq, (size_t)n * sizeof(*a));
		if (!a)
			return;
		c->aq = a;
		c->aqcap = n;
	}
	c->aq[c->aqlen++] = (struct sv_async){type, elem, port};
	if (!c->asig) {
		c->asig = 1;
		sv_evfd_set(c->vctx.context.async_fd);
	}
}

/* sv_async_drop removes queued (not yet read) events about elem. */
static void sv_async_drop(struct sv_ctx *c, void *elem)
{
	int j = 0;
	for (int i = 0; i < c->aqlen; i++)
		if (c->aq[i].elem != elem)
			c->aq[j++] = c->aq[i];
	c->aqlen = j;
	if (!c->aqlen && c->asig) {
		c->asig = 0;
		sv_evfd_clear(c->vctx.context.async_fd);
	}
}

static int sv_wait_fd(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0 && (fl & O_NONBLOCK)) {
		errno = EAGAIN;
		return -1;
	}
	struct pollfd p = {.fd = fd, .events = POLLIN};
	if (poll(&p, 1, -1) < 0)
		return -1;
	return 0;
}

SV_EXPORT int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
	if (!context || !event) {
		errno = EINVAL;
		return -1;
	}
	struct sv_ctx *c = sv_ctx(context);
	for (;;) {
		pthread_mutex_lock(&c->lk);
		if (c->aqlen) {
			struct sv_async a = c->aq[0];
			memmove(c->aq, c->aq + 1, (size_t)(c->aqlen - 1) * sizeof(*c->aq));
			c->aqlen--;
			if (!c->aqlen && c->asig) {
				c->asig = 0;
				sv_evfd_clear(context->async_fd);
			}
			memset(event, 0, sizeof(*event));
			event->event_type = a.type;
			switch (a.type) {
			case IBV_EVENT_CQ_ERR:
				event->element.cq = a.elem;
				__atomic_add_fetch(&((struct sv_cq *)a.elem)->async_reported, 1, __ATOMIC_SEQ_CST);
				break;
			case IBV_EVENT_SRQ_ERR:
			case IBV_EVENT_SRQ_LIMIT_REACHED:
				event->element.srq = a.elem;
				__atomic_add_fetch(&((struct sv_srq *)a.elem)->ev_reported, 1, __ATOMIC_SEQ_CST);
				break;
			case IBV_EVENT_QP_FATAL:
			case IBV_EVENT_QP_REQ_ERR:
			case IBV_EVENT_QP_ACCESS_ERR:
			case IBV_EVENT_COMM_EST:
			case IBV_EVENT_SQ_DRAINED:
			case IBV_EVENT_PATH_MIG:
			case IBV_EVENT_PATH_MIG_ERR:
			case IBV_EVENT_QP_LAST_WQE_REACHED:
				event->element.qp = a.elem;
				__atomic_add_fetch(&((struct sv_qp *)a.elem)->ev_reported, 1, __ATOMIC_SEQ_CST);
				break;
			default:
				event->element.port_num = a.port;
				break;
			}
			pthread_mutex_unlock(&c->lk);
			return 0;
		}
		pthread_mutex_unlock(&c->lk);
		if (sv_wait_fd(context->async_fd))
			return -1;
	}
}

SV_EXPORT void ibv_ack_async_event(struct ibv_async_event *event)
{
	if (!event)
		return;
	switch (event->event_type) {
	case IBV_EVENT_CQ_ERR: {
		struct ibv_cq *cq = event->element.cq;
		if (!cq)
			return;
		pthread_mutex_lock(&cq->mutex);
		++cq->async_events_completed;
		pthread_cond_broadcast(&cq->cond);
		pthread_mutex_unlock(&cq->mutex);
		return;
	}
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED: {
		struct ibv_srq *srq = event->element.srq;
		if (!srq)
			return;
		pthread_mutex_lock(&srq->mutex);
		++srq->events_completed;
		pthread_cond_broadcast(&srq->cond);
		pthread_mutex_unlock(&srq->mutex);
		return;
	}
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED: {
		struct ibv_qp *qp = event->element.qp;
		if (!qp)
			return;
		pthread_mutex_lock(&qp->mutex);
		++qp->events_completed;
		pthread_cond_broadcast(&qp->cond);
		pthread_mutex_unlock(&qp->mutex);
		return;
	}
	default:
		return;
	}
}

/* ---- device and port queries ---- */

static void sv_fill_device_attr(const struct sv_dev *d, struct ibv_device_attr *a)
{
	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "1.0.0 (softverbs)");
	a->node_guid = htobe64(d->guid);
	a->sys_image_guid = a->node_guid;
	a->max_mr_size = ~0ULL;
	a->page_size_cap = ~4095ULL;
	a->vendor_id = SV_VENDOR_ID;
	a->vendor_part_id = SV_VENDOR_PART_ID;
	a->hw_ver = 1;
	a->max_qp = SV_NQPN;
	a->max_qp_wr = SV_MAX_QP_WR;
	a->device_cap_flags = IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_RC_RNR_NAK_GEN |
			      IBV_DEVICE_CURR_QP_STATE_MOD | IBV_DEVICE_SYS_IMAGE_GUID |
			      IBV_DEVICE_CHANGE_PHY_PORT;
	a->max_sge = SV_MAX_SGE;
	a->max_sge_rd = SV_MAX_SGE;
	a->max_cq = 1 << 24;
	a->max_cqe = SV_MAX_CQE;
	a->max_mr = 1 << 24;
	a->max_pd = 1 << 24;
	a->max_qp_rd_atom = SV_MAX_RD_ATOM;
	a->max_ee_rd_atom = 0;
	a->max_res_rd_atom = SV_MAX_RD_ATOM * SV_NQPN;
	a->max_qp_init_rd_atom = SV_MAX_RD_ATOM;
	a->atomic_cap = IBV_ATOMIC_HCA;
	a->max_mw = 0;
	a->max_mcast_grp = 0;
	a->max_ah = 1 << 20;
	a->max_srq = 1 << 16;
	a->max_srq_wr = SV_MAX_QP_WR;
	a->max_srq_sge = SV_MAX_SGE;
	a->max_pkeys = sv_cfg.ib ? SV_PKEY_TBL_LEN_IB : SV_PKEY_TBL_LEN_ETH;
	a->local_ca_ack_delay = 16;
	a->phys_port_cnt = 1;
}

SV_EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *device_attr)
{
	if (!context || !device_attr)
		return EINVAL;
	sv_fill_device_attr(sv_ctx(context)->dev, device_attr);
	return 0;
}

static int sv_query_device_ex(struct ibv_context *context, const struct ibv_query_device_ex_input *input,
			      struct ibv_device_attr_ex *attr, size_t attr_size)
{
	struct ibv_device_attr_ex a;
	if (!context || !attr)
		return EINVAL;
	if (input && input->comp_mask)
		return EINVAL;
	if (attr_size < sizeof(attr->orig_attr))
		return EINVAL;
	memset(&a, 0, sizeof(a));
	sv_fill_device_attr(sv_ctx(context)->dev, &a.orig_attr);
	/* The extended attributes of a generic device: one port, the same capability flags, no
	 * ODP, timestamps, TSO, RSS, tag matching, packet pacing, device memory or PCI atomics. */
	a.device_cap_flags_ex = a.orig_attr.device_cap_flags;
	a.phys_port_cnt_ex = 1;
	memset(attr, 0, attr_size);
	memcpy(attr, &a, attr_size < sizeof(a) ? attr_size : sizeof(a));
	return 0;
}

static void sv_fill_port_attr(struct sv_ctx *c, struct ibv_port_attr *p)
{
	memset(p, 0, sizeof(*p));
	int up = sv_port_active(c);
	p->state = up ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
	p->max_mtu = IBV_MTU_4096;
	p->active_mtu = sv_cfg.active_mtu;
	p->gid_tbl_len = SV_GID_TBL_LEN;
	p->port_cap_flags = sv_cfg.ib ? IBV_PORT_CM_SUP : IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS;
	p->max_msg_sz = SV_MAX_MSG;
	p->pkey_tbl_len = sv_cfg.ib ? SV_PKEY_TBL_LEN_IB : SV_PKEY_TBL_LEN_ETH;
	p->lid = sv_cfg.ib ? c->dev->lid : 0;
	p->sm_lid = sv_cfg.ib ? sv_devs[0].lid : 0;
	p->max_vl_num = sv_cfg.ib ? 4 : 0;
	p->subnet_timeout = sv_cfg.ib ? 18 : 0;
	p->active_width = 2;  /* 4x */
	p->active_speed = 32; /* EDR: 4x EDR is 100 Gb/s */
	p->phys_state = up ? 5 : c->dev->phantom ? 2 : 3; /* LinkUp : Polling (no cable) : Disabled */
	p->link_layer = sv_cfg.ib ? IBV_LINK_LAYER_INFINIBAND : IBV_LINK_LAYER_ETHERNET;
}

static int sv_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *port_attr,
			 size_t len)
{
	struct ibv_port_attr p;
	if (!context || !port_attr)
		return EINVAL;
	if (port_num != 1)
		return EINVAL;
	struct sv_ctx *c = sv_ctx(context);
	pthread_mutex_lock(&c->lk);
	sv_fill_port_attr(c, &p);
	pthread_mutex_unlock(&c->lk);
	memcpy(port_attr, &p, len < sizeof(p) ? len : sizeof(p));
	return 0;
}

/* The exported symbol, for programs built before the extended context existed: it fills the
 * old, shorter struct. */
SV_EXPORT int ibv_query_port(struct ibv_context *context, uint8_t port_num,
			     struct _compat_ibv_port_attr *port_attr)
{
	return sv_query_port(context, port_num, (struct ibv_port_attr *)port_attr,
			     offsetof(struct ibv_port_attr, link_layer) + 1);
}

SV_EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid)
{
	struct sv_gid g;
	if (!context || !gid || port_num != 1 || index < 0) {
		errno = EINVAL;
		return -1;
	}
	int rc = sv_gid_at(sv_ctx(context)->dev, (unsigned)index, &g);
	if (rc == EINVAL) {
		errno = EINVAL;
		return -1;
	}
	*gid = g.gid; /* zero when the entry is empty */
	return 0;
}

SV_EXPORT int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
				struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
	struct sv_gid g;
	if (!context || !entry || flags || entry_size < sizeof(*entry) || port_num != 1)
		return EINVAL;
	int rc = sv_gid_at(sv_ctx(context)->dev, gid_index, &g);
	if (rc)
		return rc;
	memset(entry, 0, entry_size);
	entry->gid = g.gid;
	entry->gid_index = gid_index;
	entry->port_num = 1;
	entry->gid_type = g.type;
	entry->ndev_ifindex = sv_cfg.ib ? 0 : 1;
	return 0;
}

SV_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries,
				       size_t max_entries, uint32_t flags, size_t entry_size)
{
	struct sv_gid g;
	if (!context || flags || entry_size < sizeof(*entries))
		return -EINVAL;
	const struct sv_dev *d = sv_ctx(context)->dev;
	size_t n = 0;
	for (unsigned i = 0; i < SV_GID_TBL_LEN; i++)
		if (!sv_gid_at(d, i, &g))
			n++;
	if (n > max_entries || (n && !entries))
		return -EINVAL;
	n = 0;
	for (unsigned i = 0; i < SV_GID_TBL_LEN; i++) {
		if (sv_gid_at(d, i, &g))
			continue;
		struct ibv_gid_entry *e = (struct ibv_gid_entry *)((char *)entries + n * entry_size);
		memset(e, 0, entry_size);
		e->gid = g.gid;
		e->gid_index = i;
		e->port_num = 1;
		e->gid_type = g.type;
		e->ndev_ifindex = sv_cfg.ib ? 0 : 1;
		n++;
	}
	return (ssize_t)n;
}

/* enum ibv_gid_type_sysfs of rdma-core: 0 IB/RoCE v1, 1 RoCE v2. */
SV_EXPORT int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
				 int *type)
{
	struct sv_gid g;
	if (!context || !type || port_num != 1) {
		errno = EINVAL;
		return -1;
	}
	int rc = sv_gid_at(sv_ctx(context)->dev, index, &g);
	if (rc == ENODATA) {
		*type = 0;
		return 0;
	}
	if (rc) {
		errno = rc;
		return -1;
	}
	*type = g.type == IBV_GID_TYPE_ROCE_V2 ? 1 : 0;
	return 0;
}

SV_EXPORT int ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index, __be16 *pkey)
{
	int len = sv_cfg.ib ? SV_PKEY_TBL_LEN_IB : SV_PKEY_TBL_LEN_ETH;
	if (!context || !pkey || port_num != 1 || index < 0 || index >= len) {
		errno = EINVAL;
		return -1;
	}
	*pkey = index == 0 ? htobe16(0xffff) : 0;
	return 0;
}

SV_EXPORT int ibv_get_pkey_index(struct ibv_context *context, uint8_t port_num, __be16 pkey)
{
	if (!context || port_num != 1) {
		errno = EINVAL;
		return -1;
	}
	if (be16toh(pkey) == 0xffff)
		return 0;
	errno = ENOENT;
	return -1;
}

/* ---- completion queues and channels ---- */

static void sv_channel_notify(struct sv_channel *ch, struct sv_cq *cq)
{
	pthread_mutex_lock(&ch->lk);
	if (ch->qlen == ch->qcap) {
		int n = ch->qcap ? ch->qcap * 2 : 16;
		struct sv_cq **q = realloc(ch->q, (size_t)n * sizeof(*q));
		if (!q) {
			pthread_mutex_unlock(&ch->lk);
			return;
		}
		ch->q = q;
		ch->qcap = n;
	}
	ch->q[ch->qlen++] = cq;
	if (!ch->signaled) {
		ch->signaled = 1;
		sv_evfd_set(ch->ch.fd);
	}
	pthread_mutex_unlock(&ch->lk);
}

/* sv_cq_push adds a CQE; -1 when the CQ overran (or had). Context lock held. */
static int sv_cq_push(struct sv_cq *cq, const struct ibv_wc *wc, struct sv_qp *qp, int is_send,
		      uint32_t release, int solicited)
{
	pthread_mutex_lock(&cq->lk);
	if (cq->err) {
		pthread_mutex_unlock(&cq->lk);
		return -1;
	}
	if (cq->count == cq->cap) {
		cq->err = 1;
		pthread_mutex_unlock(&cq->lk);
		sv_async_push(cq->ctx, IBV_EVENT_CQ_ERR, cq, 0);
		return -1;
	}
	struct sv_cqe *e = &cq->ring[(cq->head + cq->count) % cq->cap];
	e->wc = *wc;
	e->qp = qp;
	e->is_send = is_send;
	e->release = release;
	__atomic_store_n(&cq->count, cq->count + 1, __ATOMIC_RELEASE);
	int fire = cq->armed == 1 || (cq->armed == 2 && (solicited || wc->status != IBV_WC_SUCCESS));
	if (fire)
		cq->armed = 0;
	pthread_mutex_unlock(&cq->lk);
	if (fire && cq->ch)
		sv_channel_notify(cq->ch, cq);
	return 0;
}

/* sv_cq_clean removes the CQEs of qp (destroy, reset), as libibverbs providers do. */
static void sv_cq_clean(struct sv_cq *cq, struct sv_qp *qp)
{
	pthread_mutex_lock(&cq->lk);
	int j = 0;
	for (int i = 0; i < cq->count; i++) {
		struct sv_cqe *e = &cq->ring[(cq->head + i) % cq->cap];
		if (e->qp == qp)
			continue;
		if (i != j)
			cq->ring[(cq->head + j) % cq->cap] = *e;
		j++;
	}
	__atomic_store_n(&cq->count, j, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&cq->lk);
}

static int sv_poll_cq(struct ibv_cq *ibcq, int num_entries, struct ibv_wc *wc)
{
	if (!ibcq || num_entries < 0 || (num_entries && !wc))
		return -1;
	struct sv_cq *cq = (struct sv_cq *)ibcq;
	int n = 0;
	if (!__atomic_load_n(&cq->count, __ATOMIC_ACQUIRE)) {
		/* Empty: do the NIC's receive work on this thread if nobody else is (a polling
		 * consumer then needs no thread wake-up), and give the CPU away when that finds
		 * nothing, since the NIC shares the host's cores. */
		struct sv_ctx *c = cq->ctx;
		int busy = 1; /* the thread holds the sockets: let it run */
		if (!pthread_mutex_trylock(&c->lk)) {
			struct epoll_event evs[16];
			int k = epoll_wait(c->epfd, evs, 16, 0);
			if (k > 0)
				sv_rx(c, evs, k, 0);
			__atomic_store_n(&c->poll_ns, sv_now_ns(), __ATOMIC_RELAXED);
			/* A poll of an armed CQ is an event consumer's look before it waits (the
			 * poll after the arm, or a CQ it keeps armed across polls): not a busy
			 * poller's, so the thread keeps the sockets. */
			if (!__atomic_load_n(&cq->armed, __ATOMIC_RELAXED) &&
			    __atomic_load_n(&c->poll_streak, __ATOMIC_RELAXED) < SV_POLL_STREAK)
				__atomic_add_fetch(&c->poll_streak, 1, __ATOMIC_RELAXED);
			busy = __atomic_load_n(&c->poll_streak, __ATOMIC_RELAXED) >= SV_POLL_STREAK;
			pthread_mutex_unlock(&c->lk);
		}
		if (!__atomic_load_n(&cq->count, __ATOMIC_ACQUIRE)) {
			/* Only a busy poller gives the CPU away: a consumer that polls once after
			 * arming (the event-mode cycle) goes on to wait for its event, and a yield
			 * there is a context switch in the middle of its turn. */
			if (busy)
				sched_yield();
			return 0;
		}
	}
	pthread_mutex_lock(&cq->lk);
	while (n < num_entries && cq->count) {
		struct sv_cqe *e = &cq->ring[cq->head];
		wc[n++] = e->wc;
		if (e->qp && e->is_send != 2) /* 2: an SRQ RECV, whose slot was freed when taken */
			__atomic_store_n(e->is_send ? &e->qp->sq_released : &e->qp->rq_released, e->release,
					 __ATOMIC_RELEASE);
		cq->head = (cq->head + 1) % cq->cap;
		__atomic_store_n(&cq->count, cq->count - 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&cq->lk);
	return n;
}

static int sv_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	if (!ibcq)
		return EINVAL;
	struct sv_cq *cq = (struct sv_cq *)ibcq;
	pthread_mutex_lock(&cq->lk);
	if (!cq->armed || !solicited_only)
		cq->armed = solicited_only ? 2 : 1;
	pthread_mutex_unlock(&cq->lk);
	/* A consumer that arms a CQ waits for events: the progress thread must read the
	 * sockets again, at once if it had left them to the pollers. */
	struct sv_ctx *c = cq->ctx;
	__atomic_store_n(&c->poll_streak, 0, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&c->leave_rx, __ATOMIC_SEQ_CST))
		sv_evfd_set(c->wakefd);
	return 0;
}

SV_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	if (!context) {
		errno = EINVAL;
		return NULL;
	}
	struct sv_channel *ch = calloc(1, sizeof(*ch));
	if (!ch) {
		errno = ENOMEM;
		return NULL;
	}
	ch->ch.fd = eventfd(0, EFD_CLOEXEC);
	if (ch->ch.fd < 0) {
		int e = errno;
		free(ch);
		errno = e;
		return NULL;
	}
	ch->ch.context = context;
	ch->ch.refcnt = 0;
	pthread_mutex_init(&ch->lk, NULL);
	return &ch->ch;
}

SV_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	if (!channel)
		return EINVAL;
	struct sv_channel *ch = (struct sv_channel *)channel;
	struct sv_ctx *c = sv_ctx(channel->context);
	pthread_mutex_lock(&c->lk);
	if (channel->refcnt) {
		pthread_mutex_unlock(&c->lk);
		errno = EBUSY;
		return EBUSY;
	}
	pthread_mutex_unlock(&c->lk);
	close(ch->ch.fd);
	pthread_mutex_destroy(&ch->lk);
	free(ch->q);
	free(ch);
	return 0;
}

SV_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)
{
	if (!channel || !cq || !cq_context) {
		errno = EINVAL;
		return -1;
	}
	struct sv_channel *ch = (struct sv_channel *)channel;
	for (;;) {
		pthread_mutex_lock(&ch->lk);
		if (ch->qlen) {
			struct sv_cq *q = ch->q[0];
			memmove(ch->q, ch->q + 1, (size_t)(ch->qlen - 1) * sizeof(*ch->q));
			ch->qlen--;
			if (!ch->qlen && ch->signaled) {
				ch->signaled = 0;
				sv_evfd_clear(ch->ch.fd);
			}
			__atomic_add_fetch(&q->comp_reported, 1, __ATOMIC_SEQ_CST);
			pthread_mutex_unlock(&ch->lk);
			*cq = &q->cq;
			*cq_context = q->cq.cq_context;
			return 0;
		}
		pthread_mutex_unlock(&ch->lk);
		if (sv_wait_fd(channel->fd))
			return -1;
	}
}

SV_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	if (!cq)
		return;
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_cond_broadcast(&cq->cond);
	pthread_mutex_unlock(&cq->mutex);
}

static uint32_t sv_pow2(uint32_t v)
{
	uint32_t p = 1;
	while (p < v)
		p <<= 1;
	return p;
}

SV_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
				       struct ibv_comp_channel *channel, int comp_vector)
{
	if (!context || cqe < 1 || cqe > SV_MAX_CQE || comp_vector < 0 ||
	    comp_vector >= context->num_comp_vectors || (channel && channel->context != context)) {
		errno = EINVAL;
		return NULL;
	}
	struct sv_ctx *c = sv_ctx(context);
	if (sv_dead(c)) {
		errno = EIO;
		return NULL;
	}
	struct sv_cq *cq = calloc(1, sizeof(*cq));
	if (!cq) {
		errno = ENOMEM;
		return NULL;
	}
	cq->cap = (int)sv_pow2((uint32_t)cqe + 1) - 1; /* as mlx5 rounds */
	cq->ring = calloc((size_t)cq->cap, sizeof(*cq->ring));
	if (!cq->ring) {
		free(cq);
		errno = ENOMEM;
		return NULL;
	}
	cq->ctx = c;
	pthread_mutex_init(&cq->lk, NULL);
	cq->cq.context = context;
	cq->cq.channel = channel;
	cq->cq.cq_context = cq_context;
	cq->cq.cqe = cq->cap;
	pthread_mutex_init(&cq->cq.mutex, NULL);
	pthread_cond_init(&cq->cq.cond, NULL);
	cq->ch = (struct sv_channel *)channel;
	pthread_mutex_lock(&c->lk);
	if (channel)
		channel->refcnt++;
	pthread_mutex_unlock(&c->lk);
	return &cq->cq;
}

SV_EXPORT int ibv_resize_cq(struct ibv_cq *ibcq, int cqe)
{
	if (!ibcq || cqe < 1 || cqe > SV_MAX_CQE)
		return EINVAL;
	struct sv_cq *cq = (struct sv_cq *)ibcq;
	int cap = (int)sv_pow2((uint32_t)cqe + 1) - 1;
	struct sv_cqe *r = calloc((size_t)cap, sizeof(*r));
	if (!r)
		return ENOMEM;
	pthread_mutex_lock(&cq->lk);
	if (cq->count > cap) {
		pthread_mutex_unlock(&cq->lk);
		free(r);
		return EINVAL;
	}
	for (int i = 0; i < cq->count; i++)
		r[i] = cq->ring[(cq->head + i) % cq->cap];
	free(cq->ring);
	cq->ring = r;
	cq->head = 0;
	cq->cap = cap;
	cq->cq.cqe = cap;
	pthread_mutex_unlock(&cq->lk);
	return 0;
}

SV_EXPORT int ibv_destroy_cq(struct ibv_cq *ibcq)
{
	if (!ibcq)
		return EINVAL;
	struct sv_cq *cq = (struct sv_cq *)ibcq;
	struct sv_ctx *c = cq->ctx;
	pthread_mutex_lock(&c->lk);
	if (cq->nqp) {
		pthread_mutex_unlock(&c->lk);
		errno = EBUSY;
		return EBUSY;
	}
	sv_async_drop(c, cq);
	if (cq->ch) {
		struct sv_channel *ch = cq->ch;
		pthread_mutex_lock(&ch->lk);
		int j = 0;
		for (int i = 0; i < ch->qlen; i++)
			if (ch->q[i] != cq)
				ch->q[j++] = ch->q[i];
		ch->qlen = j;
		if (!ch->qlen && ch->signaled) {
			ch->signaled = 0;
			sv_evfd_clear(ch->ch.fd);
		}
		pthread_mutex_unlock(&ch->lk);
		ch->ch.refcnt--;
	}
	pthread_mutex_unlock(&c->lk);
	/* As libibverbs: wait until every event handed out was acknowledged. */
	pthread_mutex_lock(&ibcq->mutex);
	while (ibcq->comp_events_completed != __atomic_load_n(&cq->comp_reported, __ATOMIC_SEQ_CST) ||
	       ibcq->async_events_completed != __atomic_load_n(&cq->async_reported, __ATOMIC_SEQ_CST))
		pthread_cond_wait(&ibcq->cond, &ibcq->mutex);
	pthread_mutex_unlock(&ibcq->mutex);
	pthread_mutex_destroy(&cq->lk);
	free(cq->ring);
	free(cq);
	return 0;
}

/* ---- PDs and MRs ---- */

SV_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	if (!context) {
		errno = EINVAL;
		return NULL;
	}
	if (sv_dead(sv_ctx(context))) {
		errno = EIO;
		return NULL;
	}
	struct sv_pd *pd = calloc(1, sizeof(*pd));
	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	pd->pd.context = context;
	pd->pd.handle = 0;
	return &pd->pd;
}

SV_EXPORT int ibv_dealloc_pd(struct ibv_pd *ibpd)
{
	if (!ibpd)
		return EINVAL;
	struct sv_pd *pd = (struct sv_pd *)ibpd;
	struct sv_ctx *c = sv_ctx(ibpd->context);
	pthread_mutex_lock(&c->lk);
	if (pd->refs) {
		pthread_mutex_unlock(&c->lk);
		errno = EBUSY;
		return EBUSY;
	}
	pthread_mutex_unlock(&c->lk);
	free(pd);
	return 0;
}

static struct sv_mr *sv_mr_find(struct sv_ctx *c, uint32_t lkey)
{
	for (struct sv_mr *m = c->mrs[lkey % SV_MR_BUCKETS]; m; m = m->next)
		if (m->mr.lkey == lkey)
			return m;
	return NULL;
}

static struct ibv_mr *sv_reg(struct ibv_pd *ibpd, void *addr, size_t length, uint64_t iova, int access)
{
	if (!ibpd || !length) {
		errno = EINVAL;
		return NULL;
	}
	const int known = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			  IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED |
			  IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB | IBV_ACCESS_RELAXED_ORDERING;
	if ((access & ~known) ||
	    ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE))) {
		errno = EINVAL;
		return NULL;
	}
	if (access & (IBV_ACCESS_ON_DEMAND | IBV_ACCESS_ZERO_BASED | IBV_ACCESS_MW_BIND)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	struct sv_ctx *c = sv_ctx(ibpd->context);
	if (sv_dead(c)) {
		errno = EIO;
		return NULL;
	}
	/* Pinning fails on unmapped memory: check the range is mapped. */
	long pg = sysconf(_SC_PAGESIZE);
	uintptr_t start = (uintptr_t)addr & ~(uintptr_t)(pg - 1);
	if ((uintptr_t)addr + length < (uintptr_t)addr) {
		errno = EINVAL;
		return NULL;
	}
	size_t span = (uintptr_t)addr + length - start;
	size_t npages = (span + (size_t)pg - 1) / (size_t)pg;
	unsigned char *vec = malloc(npages);
	if (!vec) {
		errno = ENOMEM;
		return NULL;
	}
	int mapped = mincore((void *)start, span, vec) == 0;
	free(vec);
	if (!mapped) {
		errno = EFAULT;
		return NULL;
	}
	struct sv_mr *m = calloc(1, sizeof(*m));
	if (!m) {
		errno = ENOMEM;
		return NULL;
	}
	pthread_mutex_lock(&c->lk);
	uint32_t key;
	do {
		key = c->next_key++;
		if (c->next_key == 0)
			c->next_key = 0x100;
	} while (sv_mr_find(c, key));
	m->mr.context = ibpd->context;
	m->mr.pd = ibpd;
	m->mr.addr = addr;
	m->mr.length = length;
	m->mr.handle = key;
	m->mr.lkey = key;
	m->mr.rkey = key;
	m->pd = (struct sv_pd *)ibpd;
	m->access = access;
	m->iova = iova;
	m->next = c->mrs[key % SV_MR_BUCKETS];
	c->mrs[key % SV_MR_BUCKETS] = m;
	m->pd->refs++;
	pthread_mutex_unlock(&c->lk);
	return &m->mr;
}

SV_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return sv_reg(pd, addr, length, (uintptr_t)addr, access);
}

SV_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
					 int access)
{
	return sv_reg(pd, addr, length, iova, access);
}

SV_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
					  unsigned int access)
{
	return sv_reg(pd, addr, length, iova, (int)access);
}

SV_EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
					   uint64_t iova, int fd, int access)
{
	(void)pd, (void)offset, (void)length, (void)iova, (void)fd, (void)access;
	errno = EOPNOTSUPP;
	return NULL;
}

SV_EXPORT int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length,
			   int access)
{
	(void)mr, (void)flags, (void)pd, (void)addr, (void)length, (void)access;
	errno = EOPNOTSUPP;
	return IBV_REREG_MR_ERR_INPUT;
}

SV_EXPORT int ibv_dereg_mr(struct ibv_mr *ibmr)
{
	if (!ibmr)
		return EINVAL;
	struct sv_ctx *c = sv_ctx(ibmr->context);
	struct sv_mr *m = (struct sv_mr *)ibmr;
	pthread_mutex_lock(&c->lk);
	struct sv_mr **pp = &c->mrs[ibmr->lkey % SV_MR_BUCKETS];
	while (*pp && *pp != m)
		pp = &(*pp)->next;
	if (!*pp) {
		pthread_mutex_unlock(&c->lk);
		return EINVAL;
	}
	*pp = m->next;
	m->pd->refs--;
	pthread_mutex_unlock(&c->lk);
	free(m);
	return 0;
}

/* sv_mr_check finds the MR of [addr, addr+len) under lkey in pd with the access needed. */
static int sv_mr_check(struct sv_ctx *c, struct sv_pd *pd, uint32_t lkey, uint64_t addr, uint32_t len,
		       int need)
{
	struct sv_mr *m = sv_mr_find(c, lkey);
	if (!m || m->pd != pd || (m->access & need) != need)
		return -1;
	uint64_t lo = (uintptr_t)m->mr.addr, hi = lo + m->mr.length;
	if (addr < lo || addr > hi || len > hi - addr)
		return -1;
	return 0;
}

/* sv_mr_remote finds the MR of [va, va+len) (its iova space) under rkey in pd, with the access
 * needed, and gives the local address of va; NULL when the key, the PD, the rights or the
 * bounds fail (a remote access error). */
static uint8_t *sv_mr_remote(struct sv_ctx *c, struct sv_pd *pd, uint32_t rkey, uint64_t va, uint64_t len,
			     int need)
{
	struct sv_mr *m = sv_mr_find(c, rkey);
	if (!m || m->pd != pd || (m->access & need) != need)
		return NULL;
	uint64_t lo = m->iova, hi = lo + m->mr.length;
	if (va < lo || va > hi || len > hi - va)
		return NULL;
	return (uint8_t *)m->mr.addr + (va - lo);
}

/* ---- QP engine ---- */

static int64_t sv_ack_timeout_ns(uint8_t t)
{
	if (t == 0)
		return 0; /* infinite */
	int64_t ns = t >= 31 ? (int64_t)4096 << 31 : (int64_t)4096 << t;
	return ns < sv_cfg.min_ack_ns ? sv_cfg.min_ack_ns : ns;
}

static const int64_t sv_rnr_ns[32] = {
	655360000, 10000, 20000, 30000, 40000, 60000, 80000, 120000,
	160000, 240000, 320000, 480000, 640000, 960000, 1280000, 1920000,
	2560000, 3840000, 5120000, 7680000, 10240000, 15360000, 20480000, 30720000,
	40960000, 61440000, 81920000, 122880000, 163840000, 245760000, 327680000, 491520000,
};

static void sv_wake(struct sv_ctx *c, int64_t deadline)
{
	if (c->sleep_until && deadline < c->sleep_until) {
		c->sleep_until = deadline;
		sv_evfd_set(c->wakefd);
	}
}

static void sv_arm(struct sv_qp *q, int64_t now)
{
	int64_t t = sv_ack_timeout_ns(q->attr.timeout);
	q->ack_deadline = t ? now + t : 0;
	if (q->ack_deadline)
		sv_wake(q->ctx, q->ack_deadline);
}

static void sv_send_pkt_to(struct sv_qp *q, const struct sv_hdr *h, const uint8_t *payload,
			   const struct sockaddr_in *dest);

static void sv_send_pkt(struct sv_qp *q, const struct sv_hdr *h, const uint8_t *payload)
{
	sv_send_pkt_to(q, h, payload, &q->dest);
}

/* The packets one sv_pump sends leave in batches of up to SV_TX_BATCH per sendmmsg (a
 * message of many path-MTU packets costs a few system calls, not one each), in the order
 * they were made; a batch holds one QP's packets. */
enum { SV_TX_BATCH = 16 };
/* Consecutive SV_FLAG_REF packets (a few dozen bytes each, no payload) to the same address
 * share a datagram, up to SV_TRAIN_MAX bytes of them (a GSO-like train): the receiver
 * takes them out one by one, each with its own PSN and checks. Loss faults (drop_pct)
 * still apply to each packet; a datagram the kernel drops loses its whole train, as a
 * burst on a congested link. */
enum { SV_TRAIN_MAX = SV_MAX_PAYLOAD };
struct sv_txb {
	int n;
	struct sv_qp *q;
	int train[SV_TX_BATCH]; /* entry i is a train of REF packets that may grow */
	size_t len[SV_TX_BATCH];
	struct sockaddr_in dest[SV_TX_BATCH];
	uint8_t buf[SV_TX_BATCH][SV_MAX_HDR + SV_MAX_PAYLOAD];
};

static void sv_tx_flush(struct sv_ctx *c)
{
	struct sv_txb *b = c->txb;
	if (!b || !b->n)
		return;
	struct iovec iov[SV_TX_BATCH];
	struct mmsghdr mm[SV_TX_BATCH];
	for (int i = 0; i < b->n; i++) {
		iov[i] = (struct iovec){.iov_base = b->buf[i], .iov_len = b->len[i]};
		mm[i] = (struct mmsghdr){.msg_hdr = {.msg_name = &b->dest[i], .msg_namelen = sizeof(b->dest[i]),
						     .msg_iov = &iov[i], .msg_iovlen = 1}};
	}
	/* Non-blocking, as a single packet's send: what a full socket buffer does not take is
	 * lost, as on a congested link; the retransmit timer recovers it. */
	int sent = 0;
	for (int tries = 0; tries < 2 && sent < b->n; tries++) {
		int r = sendmmsg(b->q->fd, mm + sent, (unsigned)(b->n - sent), MSG_DONTWAIT);
		if (r <= 0)
			break;
		sent += r;
	}
	b->n = 0;
	b->q = NULL;
}

static void sv_send_pkt_to(struct sv_qp *q, const struct sv_hdr *h, const uint8_t *payload,
			   const struct sockaddr_in *dest)
{
	struct sv_ctx *c = q->ctx;
	uint8_t one[SV_MAX_HDR + SV_MAX_PAYLOAD];
	uint8_t *buf = one;
	if (!sv_port_active(c)) {
		sv_count(c->dev, SV_CNT_TX_DROPPED);
		return;
	}
	int drop = __atomic_load_n(&c->dev->faults.drop_pct, __ATOMIC_RELAXED);
	if (drop && (int)(rand_r(&c->rnd) % 100) < drop) {
		sv_count(c->dev, SV_CNT_TX_DROPPED);
		return;
	}
	sv_count(c->dev, SV_CNT_TX_PACKETS);
	struct sv_txb *b = c->txb_on ? c->txb : NULL;
	int ref = (h->flags & SV_FLAG_REF) != 0;
	if (ref)
		sv_count(c->dev, SV_CNT_SAMEHOST_TX);
	if (b) {
		if (b->n && b->q != q)
			sv_tx_flush(c);
		int t = b->n - 1;
		if (ref && t >= 0 && b->train[t] && b->len[t] + sv_wire_hdr_len(h) <= SV_TRAIN_MAX &&
		    !memcmp(&b->dest[t], dest, sizeof(*dest))) {
			b->len[t] += sv_encode(h, b->buf[t] + b->len[t]);
			return;
		}
		buf = b->buf[b->n];
		b->train[b->n] = ref;
	}
	size_t hl = sv_encode(h, buf);
	size_t pl = ref ? 0 : h->len;
	if (pl)
		memcpy(buf + hl, payload, pl);
	if (b) {
		b->q = q;
		b->len[b->n] = hl + pl;
		b->dest[b->n] = *dest;
		if (++b->n == SV_TX_BATCH)
			sv_tx_flush(c);
		return;
	}
	/* Non-blocking: a full socket buffer loses the packet, as a congested link would; the
	 * retransmit timer recovers it. */
	if (sendto(q->fd, buf, hl + pl, MSG_DONTWAIT, (const struct sockaddr *)dest, sizeof(*dest)) < 0) {
		/* lost */
	}
}

static void sv_send_ctl(struct sv_qp *q, uint8_t op, uint8_t synd, uint8_t aux, uint32_t psn)
{
	struct sv_hdr h = {.op = op, .synd = synd, .aux = aux, .dqpn = q->attr.dest_qp_num,
			   .sqpn = q->qp.qp_num, .psn = psn & SV_PSN_MASK};
	sv_send_pkt(q, &h, NULL);
}

static void sv_complete_send(struct sv_qp *q, uint32_t idx, enum ibv_wc_status st)
{
	struct sv_swqe *w = &q->sq[idx % q->sq_cap];
	if (st == IBV_WC_SUCCESS && !w->signaled)
		return;
	enum ibv_wc_opcode op = IBV_WC_SEND;
	switch (w->op) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		op = IBV_WC_RDMA_WRITE;
		break;
	case IBV_WR_RDMA_READ:
		op = IBV_WC_RDMA_READ;
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
		op = IBV_WC_COMP_SWAP;
		break;
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		op = IBV_WC_FETCH_ADD;
		break;
	default:
		break;
	}
	struct ibv_wc wc = {.wr_id = w->wr_id, .status = st, .opcode = op,
			    .byte_len = w->len, .qp_num = q->qp.qp_num};
	if (sv_cq_push(q->scq, &wc, q, 1, idx + 1, 0))
		q->overrun = 1;
}

static void sv_complete_rwqe(struct sv_qp *q, const struct sv_rwqe *w, int srq, uint32_t release,
			     enum ibv_wc_status st, uint32_t len, const struct sv_hdr *h)
{
	struct ibv_wc wc = {.wr_id = w->wr_id, .status = st, .opcode = IBV_WC_RECV, .byte_len = len,
			    .qp_num = q->qp.qp_num};
	int sol = 0;
	if (h) {
		wc.src_qp = h->sqpn;
		if (h->op == SV_OP_SEND_LAST_IMM || h->op == SV_OP_SEND_ONLY_IMM ||
		    h->op == SV_OP_WRITE_LAST_IMM || h->op == SV_OP_WRITE_ONLY_IMM) {
			wc.wc_flags |= IBV_WC_WITH_IMM;
			wc.imm_data = h->imm;
		}
		if (h->op == SV_OP_WRITE_LAST_IMM || h->op == SV_OP_WRITE_ONLY_IMM)
			wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
		if (h->op == SV_OP_UD_SEND_IMM) {
			wc.wc_flags |= IBV_WC_WITH_IMM;
			wc.imm_data = h->imm;
		}
		if ((h->op == SV_OP_UD_SEND || h->op == SV_OP_UD_SEND_IMM) && (h->flags & SV_FLAG_GRH))
			wc.wc_flags |= IBV_WC_GRH;
		sol = h->flags & SV_FLAG_SOLICITED;
	}
	if (sv_cq_push(q->rcq, &wc, q, srq ? 2 : 0, release, sol))
		q->overrun = 1;
}

static void sv_complete_recv(struct sv_qp *q, uint32_t idx, enum ibv_wc_status st, uint32_t len,
			     const struct sv_hdr *h)
{
	sv_complete_rwqe(q, &q->rq[idx % q->rq_cap], 0, idx + 1, st, len, h);
}

/* The receive queue of a QP, its own or its SRQ's (context lock held). */

static int sv_rq_empty(struct sv_qp *q)
{
	if (q->srq)
		return !q->srq_have && q->srq->head == q->srq->tail;
	return q->rq_head == q->rq_tail;
}

/* sv_rq_take makes the head RECV the message's (an SRQ's: taken from it, which may fire the
 * SRQ limit event). */
static void sv_rq_take(struct sv_qp *q)
{
	struct sv_srq *r = q->srq;
	if (!r || q->srq_have)
		return;
	struct sv_rwqe *w = &r->q[r->head % r->cap];
	q->srq_cur.wr_id = w->wr_id;
	q->srq_cur.nsge = w->nsge;
	if (w->nsge)
		memcpy(q->srq_cur_sge, w->sge, (size_t)w->nsge * sizeof(*w->sge));
	q->srq_have = 1;
	r->head++;
	if (r->limit && r->tail - r->head < r->limit) {
		r->limit = 0;
		sv_async_push(q->ctx, IBV_EVENT_SRQ_LIMIT_REACHED, r, 0);
	}
}

static struct sv_rwqe *sv_rq_cur(struct sv_qp *q)
{
	return q->srq ? &q->srq_cur : &q->rq[q->rq_head % q->rq_cap];
}

/* sv_rq_done completes the message's RECV. */
static void sv_rq_done(struct sv_qp *q, enum ibv_wc_status st, uint32_t len, const struct sv_hdr *h)
{
	if (q->srq) {
		if (q->srq_have)
			sv_complete_rwqe(q, &q->srq_cur, 1, 0, st, len, h);
		q->srq_have = 0;
		return;
	}
	sv_complete_recv(q, q->rq_head, st, len, h);
	q->rq_head++;
}

/* sv_qp_error moves q to ERR and flushes both queues. */
static void sv_qp_error(struct sv_qp *q)
{
	if (q->state == IBV_QPS_ERR)
		return;
	q->state = IBV_QPS_ERR;
	q->qp.state = IBV_QPS_ERR;
	for (uint32_t i = q->sq_done; i != q->sq_tail; i++) {
		struct sv_swqe *w = &q->sq[i % q->sq_cap];
		w->signaled = 1; /* error completions are always reported */
		sv_complete_send(q, i, IBV_WC_WR_FLUSH_ERR);
		sv_swqe_free(w);
	}
	q->sq_done = q->sq_send = q->sq_tail;
	q->sq_pkt = 0;
	q->ack_deadline = q->resume_at = 0;
	if (q->srq) {
		/* only the RECV it took is the QP's; the SRQ's others stay for its other QPs */
		sv_rq_done(q, IBV_WC_WR_FLUSH_ERR, 0, NULL);
		sv_async_push(q->ctx, IBV_EVENT_QP_LAST_WQE_REACHED, q, 0);
	}
	for (uint32_t i = q->rq_head; i != q->rq_tail; i++)
		sv_complete_recv(q, i, IBV_WC_WR_FLUSH_ERR, 0, NULL);
	q->rq_head = q->rq_tail;
	q->in_msg = 0;
}

/* sv_fail completes the oldest outstanding send WQE with st and moves q to ERR. */
static void sv_fail(struct sv_qp *q, enum ibv_wc_status st)
{
	if (st == IBV_WC_RETRY_EXC_ERR)
		sv_count(q->ctx->dev, SV_CNT_RETRY_EXC);
	else if (st == IBV_WC_RNR_RETRY_EXC_ERR)
		sv_count(q->ctx->dev, SV_CNT_RNR_RETRY_EXC);
	if (q->sq_done != q->sq_tail) {
		struct sv_swqe *w = &q->sq[q->sq_done % q->sq_cap];
		w->signaled = 1;
		sv_complete_send(q, q->sq_done, st);
		sv_swqe_free(w);
		q->sq_done++;
		if (q->sq_send - q->sq_done > q->sq_tail - q->sq_done) {
			q->sq_send = q->sq_done;
			q->sq_pkt = 0;
		}
	}
	sv_qp_error(q);
}

static int sv_inflight(struct sv_qp *q)
{
	return q->sq_done != q->sq_send || q->sq_pkt;
}

/* sv_rd_outstanding counts the READs and atomics whose requests left and whose responses
 * have not all come back (the initiator depth max_rd_atomic bounds it). */
static uint32_t sv_rd_outstanding(struct sv_qp *q)
{
	uint32_t n = 0, end = q->sq_send + (q->sq_pkt ? 1 : 0);
	for (uint32_t i = q->sq_done; i != end; i++)
		if (sv_is_rd(&q->sq[i % q->sq_cap]))
			n++;
	return n;
}

enum { SV_READ_SEG = 32 }; /* response packets asked for by one READ request packet */

static void sv_pump_wrs(struct sv_qp *q, int64_t now);

/* sv_pump sends what q's send queue may send now; its packets leave in batches (sv_txb). */
static void sv_pump(struct sv_qp *q, int64_t now)
{
	struct sv_ctx *c = q->ctx;
	if (c->txb_on) {
		sv_pump_wrs(q, now);
		return;
	}
	if (!c->txb)
		c->txb = malloc(sizeof(*c->txb));
	if (!c->txb) {
		sv_pump_wrs(q, now);
		return;
	}
	c->txb->n = 0;
	c->txb_on = 1;
	sv_pump_wrs(q, now);
	sv_tx_flush(c);
	c->txb_on = 0;
}

/* Packets this long or longer go as SV_FLAG_REF to a peer on this host: below it, a copy into
 * the datagram costs less than the receiver's process_vm_readv. */
enum { SV_REF_MIN = 1024 };

static void sv_pump_wrs(struct sv_qp *q, int64_t now)
{
	if (q->state != IBV_QPS_RTS || q->resume_at)
		return;
	while (q->sq_send != q->sq_tail) {
		struct sv_swqe *w = &q->sq[q->sq_send % q->sq_cap];
		if (w->pre) {
			if (sv_inflight(q))
				return; /* report in order, after what precedes it */
			sv_fail(q, w->pre);
			return;
		}
		if (q->qp.qp_type == IBV_QPT_UD) {
			/* UD: one packet to the WR's address, done once sent */
			struct sv_hdr u = {.op = w->imm_valid ? SV_OP_UD_SEND_IMM : SV_OP_UD_SEND,
					   .dqpn = ntohs(w->udest.sin_port), .sqpn = q->qp.qp_num, .psn = q->next_psn,
					   .imm = w->imm_valid ? w->imm : 0, .len = (uint16_t)w->len, .qkey = w->qkey};
			if (w->solicited)
				u.flags |= SV_FLAG_SOLICITED;
			if (w->grh)
				u.flags |= SV_FLAG_GRH;
			memcpy(u.sgid, w->sgid, 16);
			memcpy(u.dgid, w->dgid, 16);
			sv_send_pkt_to(q, &u, w->data, &w->udest);
			q->next_psn = (q->next_psn + 1) & SV_PSN_MASK;
			q->acked_psn = (q->next_psn - 1) & SV_PSN_MASK;
			q->sq_send++;
			sv_complete_send(q, q->sq_done, IBV_WC_SUCCESS);
			sv_swqe_free(w);
			q->sq_done++;
			continue;
		}
		int uc = q->qp.qp_type == IBV_QPT_UC;
		if (!uc && sv_psn_diff(q->next_psn, q->acked_psn) > SV_WINDOW)
			return;
		int rd = sv_is_rd(w);
		if (q->sq_pkt == 0) {
			/* A fenced WR waits for the READs and atomics before it; a READ or atomic
			 * waits while max_rd_atomic of them are outstanding. */
			if (w->fence || rd) {
				uint32_t out = sv_rd_outstanding(q);
				uint32_t depth = q->attr.max_rd_atomic ? q->attr.max_rd_atomic : 1;
				if ((w->fence && out) || (rd && out >= depth))
					return;
			}
			/* PSNs and packets are assigned as the message leaves, at the path MTU of
			 * the connection (WRs may be posted before RTR set it); a READ takes one
			 * PSN per response packet. */
			w->first_psn = q->next_psn;
			w->npkts = w->len ? (w->len + q->mtu_bytes - 1) / q->mtu_bytes : 1;
			if (w->op == IBV_WR_ATOMIC_CMP_AND_SWP || w->op == IBV_WR_ATOMIC_FETCH_AND_ADD)
				w->npkts = 1;
			w->rd_got = 0;
		}
		struct sv_hdr h = {.dqpn = q->attr.dest_qp_num, .sqpn = q->qp.qp_num, .psn = q->next_psn};
		if (rd) {
			uint32_t m = 1;
			if (w->op == IBV_WR_RDMA_READ) {
				/* ask for up to SV_READ_SEG response packets at a time, so that the
				 * window bounds the responses in flight as it bounds SENDs */
				m = w->npkts - q->sq_pkt;
				if (m > SV_READ_SEG)
					m = SV_READ_SEG;
				uint64_t off = (uint64_t)q->sq_pkt * q->mtu_bytes;
				uint64_t n = (uint64_t)m * q->mtu_bytes;
				h.op = SV_OP_READ_REQ;
				h.aux = (uint8_t)q->attr.path_mtu;
				h.va = w->rva + off;
				h.rkey = w->rkey;
				h.dlen = (uint32_t)(w->len - off < n ? w->len - off : n);
			} else {
				h.op = w->op == IBV_WR_ATOMIC_CMP_AND_SWP ? SV_OP_CMP_SWP : SV_OP_FETCH_ADD;
				h.va = w->rva;
				h.rkey = w->rkey;
				h.data0 = w->swap;
				h.data1 = w->op == IBV_WR_ATOMIC_CMP_AND_SWP ? w->cmp : 0;
			}
			sv_send_pkt(q, &h, NULL);
			q->next_psn = (q->next_psn + m) & SV_PSN_MASK;
			if (!q->ack_deadline)
				sv_arm(q, now);
			q->sq_pkt += m;
			if (q->sq_pkt == w->npkts) {
				q->sq_send++;
				q->sq_pkt = 0;
			}
			continue;
		}
		int write = w->op == IBV_WR_RDMA_WRITE || w->op == IBV_WR_RDMA_WRITE_WITH_IMM;
		uint32_t off = q->sq_pkt * q->mtu_bytes;
		uint32_t left = w->len - off;
		uint32_t n = left < q->mtu_bytes ? left : q->mtu_bytes;
		int first = q->sq_pkt == 0, last = q->sq_pkt + 1 == w->npkts;
		h.len = (uint16_t)n;
		if (write) {
			if (first && last)
				h.op = w->imm_valid ? SV_OP_WRITE_ONLY_IMM : SV_OP_WRITE_ONLY;
			else if (first)
				h.op = SV_OP_WRITE_FIRST;
			else if (last)
				h.op = w->imm_valid ? SV_OP_WRITE_LAST_IMM : SV_OP_WRITE_LAST;
			else
				h.op = SV_OP_WRITE_MIDDLE;
			if (first) {
				h.va = w->rva;
				h.rkey = w->rkey;
				h.dlen = w->len;
			}
			if (!last && w->imm_valid)
				h.flags = SV_FLAG_IMM;
		} else if (first && last)
			h.op = w->imm_valid ? SV_OP_SEND_ONLY_IMM : SV_OP_SEND_ONLY;
		else if (first)
			h.op = SV_OP_SEND_FIRST;
		else if (last)
			h.op = w->imm_valid ? SV_OP_SEND_LAST_IMM : SV_OP_SEND_LAST;
		else
			h.op = SV_OP_SEND_MIDDLE;
		if (last) {
			if (w->imm_valid)
				h.imm = w->imm;
			if (w->solicited && (!write || w->imm_valid))
				h.flags = SV_FLAG_SOLICITED;
		}
		if (!uc && q->samehost && n >= SV_REF_MIN && w->blk) {
			h.flags |= SV_FLAG_REF;
			h.rpid = q->ctx->pid;
			h.rva = (uint64_t)(uintptr_t)(w->data + off);
			h.tokva = (uint64_t)(uintptr_t)w->blk;
			memcpy(&h.tok, w->blk, sizeof(h.tok));
		}
		sv_send_pkt(q, &h, w->data ? w->data + off : NULL);
		q->next_psn = (q->next_psn + 1) & SV_PSN_MASK;
		if (uc) {
			/* UC: done once sent; nothing is acknowledged or sent again */
			q->acked_psn = (q->next_psn - 1) & SV_PSN_MASK;
			if (last) {
				q->sq_send++;
				q->sq_pkt = 0;
				sv_complete_send(q, q->sq_done, IBV_WC_SUCCESS);
				sv_swqe_free(w);
				q->sq_done++;
			} else {
				q->sq_pkt++;
			}
			continue;
		}
		if (!q->ack_deadline)
			sv_arm(q, now);
		if (last) {
			q->sq_send++;
			q->sq_pkt = 0;
		} else {
			q->sq_pkt++;
		}
	}
}

/* sv_rewind goes back to the oldest unacknowledged WQE; a READ resumes after the response
 * packets already placed. */
static void sv_rewind(struct sv_qp *q)
{
	if (!sv_inflight(q))
		return;
	struct sv_swqe *w = &q->sq[q->sq_done % q->sq_cap];
	q->sq_send = q->sq_done;
	q->sq_pkt = sv_is_rd(w) ? w->rd_got : 0;
	q->next_psn = (w->first_psn + q->sq_pkt) & SV_PSN_MASK;
}

/* sv_ack applies a cumulative ACK of psn a; 1 when it acknowledged something new. */
static int sv_ack(struct sv_qp *q, uint32_t a, int64_t now)
{
	if (sv_psn_diff(a, q->acked_psn) <= 0 || sv_psn_diff(a, q->next_psn) >= 0)
		return 0; /* duplicate, or for a PSN never sent */
	/* Only its responses complete a READ or an atomic: an ACK (a responder's answer to a
	 * duplicate) covers no more than the response packets placed. */
	uint32_t end = q->sq_send + (q->sq_pkt ? 1 : 0);
	for (uint32_t i = q->sq_done; i != end; i++) {
		struct sv_swqe *w = &q->sq[i % q->sq_cap];
		if (sv_is_rd(w) && w->rd_got < w->npkts) {
			uint32_t lim = (w->first_psn + w->rd_got - 1) & SV_PSN_MASK;
			if (sv_psn_diff(a, lim) > 0)
				a = lim;
			break;
		}
		if (sv_psn_diff(a, (w->first_psn + w->npkts - 1) & SV_PSN_MASK) < 0)
			break;
	}
	if (sv_psn_diff(a, q->acked_psn) <= 0)
		return 0;
	q->acked_psn = a;
	q->retries = 0;
	q->rnr_retries = 0;
	while (q->sq_done != q->sq_send) {
		struct sv_swqe *w = &q->sq[q->sq_done % q->sq_cap];
		uint32_t last = (w->first_psn + w->npkts - 1) & SV_PSN_MASK;
		if (sv_psn_diff(a, last) < 0)
			break;
		sv_complete_send(q, q->sq_done, IBV_WC_SUCCESS);
		sv_swqe_free(w);
		q->sq_done++;
	}
	q->ack_deadline = 0;
	if (sv_inflight(q))
		sv_arm(q, now);
	return 1;
}

static void sv_on_nak(struct sv_qp *q, const struct sv_hdr *h, int64_t now)
{
	if (sv_psn_diff(h->psn, q->next_psn) >= 0 || !sv_inflight(q))
		return; /* for nothing outstanding */
	sv_ack(q, (h->psn - 1) & SV_PSN_MASK, now);
	if (!sv_inflight(q))
		return;
	switch (h->synd) {
	case SV_NAK_RNR:
		sv_count(q->ctx->dev, SV_CNT_RNR_NAK_RECV);
		q->retries = 0; /* the peer answered: the path works */
		if (q->attr.rnr_retry != 7 && ++q->rnr_retries > q->attr.rnr_retry) {
			sv_fail(q, IBV_WC_RNR_RETRY_EXC_ERR);
			return;
		}
		sv_rewind(q);
		q->ack_deadline = 0;
		q->resume_at = now + sv_rnr_ns[h->aux & 31];
		sv_wake(q->ctx, q->resume_at);
		return;
	case SV_NAK_SEQ:
		sv_count(q->ctx->dev, SV_CNT_SEQ_NAK_RECV);
		if (q->resume_at)
			return;
		sv_rewind(q);
		sv_pump(q, now);
		return;
	case SV_NAK_NOREF:
		/* the peer cannot read this process (another PID namespace, no ptrace rights):
		 * the payloads go in the datagrams from now on */
		if (!q->samehost)
			return;
		q->samehost = 0;
		if (q->resume_at)
			return;
		sv_rewind(q);
		sv_pump(q, now);
		return;
	case SV_NAK_INV_REQ:
		sv_fail(q, IBV_WC_REM_INV_REQ_ERR);
		return;
	case SV_NAK_REM_ACCESS:
		sv_fail(q, IBV_WC_REM_ACCESS_ERR);
		return;
	default:
		sv_fail(q, IBV_WC_REM_OP_ERR);
		return;
	}
}

/* sv_scatter places len bytes at message offset off into the SGE list sge[0..nsge). */
static enum ibv_wc_status sv_scatter(struct sv_qp *q, const struct ibv_sge *sge, int nsge, uint32_t off,
				     const uint8_t *p, uint32_t len)
{
	uint64_t total = 0;
	for (int i = 0; i < nsge; i++)
		total += sge[i].length;
	if ((uint64_t)off + len > total)
		return IBV_WC_LOC_LEN_ERR;
	uint64_t pos = 0;
	for (int i = 0; i < nsge && len; i++) {
		const struct ibv_sge *s = &sge[i];
		if (pos + s->length <= off) {
			pos += s->length;
			continue;
		}
		uint32_t in = (uint32_t)(off - pos);
		uint32_t n = s->length - in < len ? s->length - in : len;
		if (sv_mr_check(q->ctx, q->pd, s->lkey, s->addr + in, n, IBV_ACCESS_LOCAL_WRITE))
			return IBV_WC_LOC_PROT_ERR;
		memcpy((void *)(uintptr_t)(s->addr + in), p, n);
		p += n;
		len -= n;
		off += n;
		pos += s->length;
	}
	return IBV_WC_SUCCESS;
}

/* sv_ack_later ACKs psn once sv_rx has handled the packets of the batch it is reading: one
 * cumulative ACK for the messages a batch completes, as a NIC coalesces its ACKs. */
static void sv_ack_later(struct sv_qp *q, uint32_t psn)
{
	q->ack_due = 1;
	q->ack_psn = psn;
}

static void sv_ack_flush(struct sv_qp *q)
{
	if (q->ack_due) {
		q->ack_due = 0;
		sv_send_ctl(q, SV_OP_ACK, 0, 0, q->ack_psn);
	}
}

/* sv_resp_error ends a request the responder cannot execute: the NAK, the responder QP to
 * ERR (an access error raises IBV_EVENT_QP_ACCESS_ERR, as on a NIC). */
static void sv_resp_error(struct sv_qp *q, uint8_t synd, uint32_t psn)
{
	sv_send_ctl(q, SV_OP_NAK, synd, 0, psn);
	if (synd == SV_NAK_REM_ACCESS && q->state != IBV_QPS_ERR)
		sv_async_push(q->ctx, IBV_EVENT_QP_ACCESS_ERR, q, 0);
	sv_qp_error(q);
}

/* sv_qp_allows: the responder QP's qp_access_flags allow a remote access of kind need. */
static int sv_qp_allows(struct sv_qp *q, int need)
{
	return (q->attr.qp_access_flags & (unsigned)need) == (unsigned)need;
}

/* sv_do_read sends the responses to a READ request at psn; 0, or -1 for an access error. */
static int sv_do_read(struct sv_qp *q, const struct sv_hdr *h, uint32_t *npkts)
{
	uint32_t mtu = 128u << h->aux;
	uint32_t m = h->dlen ? (h->dlen + mtu - 1) / mtu : 1;
	const uint8_t *src = NULL;
	if (h->dlen) {
		if (!sv_qp_allows(q, IBV_ACCESS_REMOTE_READ))
			return -1;
		src = sv_mr_remote(q->ctx, q->pd, h->rkey, h->va, h->dlen, IBV_ACCESS_REMOTE_READ);
		if (!src)
			return -1;
	}
	for (uint32_t i = 0; i < m; i++) {
		uint32_t off = i * mtu;
		uint32_t n = h->dlen - off < mtu ? h->dlen - off : mtu;
		struct sv_hdr r = {.op = SV_OP_READ_RESP, .dqpn = q->attr.dest_qp_num, .sqpn = q->qp.qp_num,
				   .psn = (h->psn + i) & SV_PSN_MASK, .len = (uint16_t)(h->dlen ? n : 0)};
		sv_send_pkt(q, &r, src ? src + off : NULL);
	}
	*npkts = m;
	return 0;
}

static void sv_atomic_reply(struct sv_qp *q, uint32_t psn, uint64_t orig)
{
	struct sv_hdr r = {.op = SV_OP_ATOMIC_ACK, .dqpn = q->attr.dest_qp_num, .sqpn = q->qp.qp_num,
			   .psn = psn, .data0 = orig};
	sv_send_pkt(q, &r, NULL);
}

/* sv_uc_request is a UC responder: no ACK, NAK or RNR. A packet lost (a PSN gap) drops the
 * message in progress, whose RECV serves the next one; a message without a RECV, or whose
 * WRITE fails its checks, is dropped; the packets of a message not started are dropped. */
static void sv_uc_request(struct sv_qp *q, const struct sv_hdr *h, const uint8_t *payload)
{
	int write = h->op >= SV_OP_WRITE_FIRST && h->op <= SV_OP_WRITE_ONLY_IMM;
	if ((!sv_op_is_send(h->op) && !write) || (h->flags & SV_FLAG_REF))
		return; /* no READs or atomics on UC, nor references (a UC sender forgets its data once sent) */
	int first = h->op == SV_OP_SEND_FIRST || h->op == SV_OP_SEND_ONLY || h->op == SV_OP_SEND_ONLY_IMM ||
		    h->op == SV_OP_WRITE_FIRST || h->op == SV_OP_WRITE_ONLY || h->op == SV_OP_WRITE_ONLY_IMM;
	int last = h->op != SV_OP_SEND_FIRST && h->op != SV_OP_SEND_MIDDLE && h->op != SV_OP_WRITE_FIRST &&
		   h->op != SV_OP_WRITE_MIDDLE;
	if (h->psn != q->epsn || first)
		q->in_msg = 0;
	q->epsn = (h->psn + 1) & SV_PSN_MASK;
	if (!first && (!q->in_msg || write != q->msg_write))
		return;
	if (first) {
		int imm = !write || (h->flags & SV_FLAG_IMM) || h->op == SV_OP_WRITE_ONLY_IMM;
		if (write) {
			uint8_t *dst = NULL;
			if (h->dlen > SV_MAX_MSG)
				return;
			if (h->dlen) {
				if (sv_qp_allows(q, IBV_ACCESS_REMOTE_WRITE))
					dst = sv_mr_remote(q->ctx, q->pd, h->rkey, h->va, h->dlen,
							   IBV_ACCESS_REMOTE_WRITE);
				if (!dst)
					return;
			}
			q->wr_ptr = dst;
			q->wr_len = h->dlen;
		}
		if (imm && sv_rq_empty(q))
			return;
		if (imm)
			sv_rq_take(q);
		q->in_msg = 1;
		q->msg_write = write;
		q->msg_imm = write && imm;
		q->msg_off = 0;
	}
	if (write) {
		if ((uint64_t)q->msg_off + h->len > q->wr_len || (last && q->msg_off + h->len != q->wr_len)) {
			q->in_msg = 0;
			return;
		}
		if (h->len)
			memcpy(q->wr_ptr + q->msg_off, payload, h->len);
	} else {
		struct sv_rwqe *w = sv_rq_cur(q);
		enum ibv_wc_status st = sv_scatter(q, w->sge, w->nsge, q->msg_off, payload, h->len);
		if (st != IBV_WC_SUCCESS) {
			sv_rq_done(q, st, q->msg_off, h);
			q->in_msg = 0;
			sv_qp_error(q);
			return;
		}
	}
	q->msg_off += h->len;
	if (last) {
		if (!write || q->msg_imm)
			sv_rq_done(q, IBV_WC_SUCCESS, q->msg_off, h);
		q->in_msg = 0;
	}
}

/* sv_ud_recv is a UD receiver: a message whose Q_Key is not the QP's, or that finds no RECV,
 * is dropped; the RECV gets the 40-byte GRH (IB layout: version 6, next header 0x1b, hop limit
 * 64, the payload length, source and destination GIDs), then the payload. */
static void sv_ud_recv(struct sv_qp *q, const struct sv_hdr *h, const uint8_t *payload)
{
	if (q->state != IBV_QPS_RTR && q->state != IBV_QPS_RTS && q->state != IBV_QPS_SQD)
		return;
	if (h->qkey != q->attr.qkey || sv_rq_empty(q))
		return;
	sv_rq_take(q);
	struct sv_rwqe *w = sv_rq_cur(q);
	uint8_t grh[40] = {0x60, 0, 0, 0};
	uint16_t plen = htons((uint16_t)(h->len + (h->op == SV_OP_UD_SEND_IMM ? 4 : 0) + 8 + 12));
	memcpy(grh + 4, &plen, 2);
	grh[6] = 0x1b;
	grh[7] = 64;
	memcpy(grh + 8, h->sgid, 16);
	memcpy(grh + 24, h->dgid, 16);
	enum ibv_wc_status st = sv_scatter(q, w->sge, w->nsge, 0, grh, 40);
	if (st == IBV_WC_SUCCESS)
		st = sv_scatter(q, w->sge, w->nsge, 40, payload, h->len);
	sv_rq_done(q, st, 40 + h->len, h);
	if (st != IBV_WC_SUCCESS)
		sv_qp_error(q);
}

enum {
	SV_RX_BATCH = 8,                 /* datagrams per recvmmsg */
	SV_RX_PKTS = SV_RX_BATCH * (SV_MAX_PAYLOAD / (SV_HDR_LEN + SV_REF_LEN)), /* packets they hold */
	SV_PF_BYTES = 64 * 1024,         /* payload bytes one process_vm_readv reads at most */
	SV_PF_PKTS = 64,                 /* and packets */
};

/* What sv_rx works with (per context, under its lock): the packets of one recvmmsg batch
 * and the payloads of their references, read ahead. */
struct sv_rxs {
	struct sv_hdr h[SV_RX_PKTS];
	const uint8_t *buf[SV_RX_PKTS]; /* the packet in its datagram */
	const uint8_t *ref[SV_RX_PKTS]; /* its payload, read ahead (REF), or NULL */
	uint64_t tok[SV_PF_PKTS]; /* the tokens the packets carry */
	uint64_t got[SV_PF_PKTS]; /* and those read after the payloads */
	uint8_t pf[SV_PF_BYTES];
};

/* sv_ref_prefetch reads ahead the SV_FLAG_REF payloads of packets h[0..n) for an RC QP, from
 * the first: those of the process the first one names, up to SV_PF_BYTES and SV_PF_PKTS, in
 * one process_vm_readv (a message's packets mostly come so). ref[j] is packet j's payload
 * when it was read and its token held, else NULL (sv_on_request then reads it alone, or
 * refuses it). It returns how many packets from the first it went through (at least 1);
 * their payloads stay in x->pf until the next call. What a duplicate's read fetches is
 * never used. */
static int sv_ref_prefetch(struct sv_qp *q, struct sv_rxs *x, const struct sv_hdr *h, int n, const uint8_t **ref)
{
	/* Packets of one WQE lie back to back in the sender: one range for them, then their
	 * token, read after it. */
	struct iovec l[2 * SV_PF_PKTS], r[2 * SV_PF_PKTS];
	int grp[SV_PF_PKTS], g = 0, m = 0, j;
	size_t bytes = 0;
	uint32_t pid = 0;
	int rc = q->qp.qp_type == IBV_QPT_RC;
	for (j = 0; j < n && j < SV_PF_PKTS; j++) {
		ref[j] = NULL;
		grp[j] = -1;
		if (!rc || !(h[j].flags & SV_FLAG_REF))
			continue;
		if ((pid && h[j].rpid != pid) || bytes + h[j].len > SV_PF_BYTES)
			break;
		pid = h[j].rpid;
		const struct iovec *pr = g ? &r[2 * (g - 1)] : NULL;
		if (pr && h[j].tokva == (uintptr_t)r[2 * g - 1].iov_base && h[j].tok == x->tok[g - 1] &&
		    h[j].rva == (uintptr_t)pr->iov_base + pr->iov_len) {
			l[2 * (g - 1)].iov_len += h[j].len;
			r[2 * (g - 1)].iov_len += h[j].len;
		} else {
			/* x->tok[g] holds the expected token until the read replaces it */
			x->tok[g] = h[j].tok;
			l[2 * g] = (struct iovec){x->pf + bytes, h[j].len};
			l[2 * g + 1] = (struct iovec){&x->got[g], sizeof(x->got[g])};
			r[2 * g] = (struct iovec){(void *)(uintptr_t)h[j].rva, h[j].len};
			r[2 * g + 1] = (struct iovec){(void *)(uintptr_t)h[j].tokva, sizeof(x->got[g])};
			x->got[g] = 0;
			g++;
		}
		ref[j] = x->pf + bytes;
		grp[j] = g - 1;
		bytes += h[j].len;
		m++;
	}
	if (j == 0)
		j = 1;
	if (m < 2) {
		/* one is read when its PSN is due, never for nothing */
		for (int k = 0; k < j; k++)
			ref[k] = NULL;
		return j;
	}
	ssize_t got = process_vm_readv((pid_t)pid, l, (unsigned long)(2 * g), r, (unsigned long)(2 * g), 0);
	/* it stops at the first range it cannot read: what precedes it was read */
	int ok[SV_PF_PKTS];
	for (int k = 0; k < g; k++) {
		size_t need = l[2 * k].iov_len + sizeof(uint64_t);
		ok[k] = got >= (ssize_t)need && x->got[k] == x->tok[k];
		got = got >= (ssize_t)need ? got - (ssize_t)need : 0;
	}
	for (int k = 0; k < j; k++) {
		if (!ref[k])
			continue;
		if (ok[grp[k]])
			sv_count(q->ctx->dev, SV_CNT_SAMEHOST_RX);
		else
			ref[k] = NULL;
	}
	return j;
}

/* sv_ref_read reads an SV_FLAG_REF payload from the sending process: the payload, then the
 * token, in one process_vm_readv; the payload if the token still holds, else NULL (the
 * sender is gone, has freed the WQE, is another process of that PID, or may not be read). */
static const uint8_t *sv_ref_read(struct sv_qp *q, const struct sv_hdr *h)
{
	static __thread uint8_t buf[SV_MAX_PAYLOAD];
	uint64_t tok = 0;
	if (q->qp.qp_type != IBV_QPT_RC)
		return NULL;
	struct iovec l[2] = {{buf, h->len}, {&tok, sizeof(tok)}};
	struct iovec r[2] = {{(void *)(uintptr_t)h->rva, h->len}, {(void *)(uintptr_t)h->tokva, sizeof(tok)}};
	ssize_t n = process_vm_readv((pid_t)h->rpid, l, 2, r, 2, 0);
	if (n != (ssize_t)(h->len + sizeof(tok)) || tok != h->tok)
		return NULL;
	sv_count(q->ctx->dev, SV_CNT_SAMEHOST_RX);
	return buf;
}

/* sv_on_request is the responder: SEND, RDMA WRITE, READ and atomic request packets. */
static void sv_on_request(struct sv_qp *q, const struct sv_hdr *h, const uint8_t *payload)
{
	if (q->state != IBV_QPS_RTR && q->state != IBV_QPS_RTS && q->state != IBV_QPS_SQD)
		return;
	if (q->qp.qp_type == IBV_QPT_UC) {
		sv_uc_request(q, h, payload);
		return;
	}
	int32_t d = sv_psn_diff(h->psn, q->epsn);
	if (d < 0) {
		sv_count(q->ctx->dev, SV_CNT_DUPLICATE);
		if (h->op == SV_OP_READ_REQ) {
			/* a READ is executed again (it changes nothing); a requester that resumes a
			 * READ after its last placed response asks for a range that may run past
			 * what it asked before: the PSNs past it are taken now */
			uint32_t m;
			if (!sv_do_read(q, h, &m) && sv_psn_diff((h->psn + m) & SV_PSN_MASK, q->epsn) > 0)
				q->epsn = (h->psn + m) & SV_PSN_MASK;
		} else if (h->op == SV_OP_CMP_SWP || h->op == SV_OP_FETCH_ADD) {
			/* an atomic is not: its saved response is sent again */
			for (int i = 0; i < SV_ACACHE; i++)
				if (q->acache[i].valid && q->acache[i].psn == h->psn)
					sv_atomic_reply(q, h->psn, q->acache[i].orig);
		} else {
			sv_send_ctl(q, SV_OP_ACK, 0, 0, q->epsn - 1);
		}
		return;
	}
	if (d > 0) {
		if (!q->nak_sent) {
			q->nak_sent = 1;
			sv_count(q->ctx->dev, SV_CNT_SEQ_NAK_SENT);
			sv_send_ctl(q, SV_OP_NAK, SV_NAK_SEQ, 0, q->epsn);
		}
		return;
	}
	if ((h->flags & SV_FLAG_REF) && !payload && !(payload = sv_ref_read(q, h))) {
		/* nothing changed: the requester sends the bytes from this PSN on */
		sv_count(q->ctx->dev, SV_CNT_SAMEHOST_REFUSED);
		sv_send_ctl(q, SV_OP_NAK, SV_NAK_NOREF, 0, h->psn);
		return;
	}
	int write = h->op >= SV_OP_WRITE_FIRST && h->op <= SV_OP_WRITE_ONLY_IMM;
	int single = h->op == SV_OP_READ_REQ || h->op == SV_OP_CMP_SWP || h->op == SV_OP_FETCH_ADD;
	int first = single || h->op == SV_OP_SEND_FIRST || h->op == SV_OP_SEND_ONLY ||
		    h->op == SV_OP_SEND_ONLY_IMM || h->op == SV_OP_WRITE_FIRST || h->op == SV_OP_WRITE_ONLY ||
		    h->op == SV_OP_WRITE_ONLY_IMM;
	int last = single || (h->op != SV_OP_SEND_FIRST && h->op != SV_OP_SEND_MIDDLE &&
			      h->op != SV_OP_WRITE_FIRST && h->op != SV_OP_WRITE_MIDDLE);
	if (first != !q->in_msg || (q->in_msg && write != q->msg_write)) {
		/* a new message inside one, or a continuation of none or of another kind */
		if (q->in_msg && (!q->msg_write || q->msg_imm))
			sv_rq_done(q, IBV_WC_REM_INV_REQ_ERR, q->msg_off, h);
		q->in_msg = 0;
		sv_resp_error(q, SV_NAK_INV_REQ, h->psn);
		return;
	}
	if (single) {
		q->nak_sent = 0;
		if (h->op == SV_OP_READ_REQ) {
			uint32_t m;
			if (h->dlen > SV_MAX_MSG) {
				sv_resp_error(q, SV_NAK_INV_REQ, h->psn);
				return;
			}
			if (sv_do_read(q, h, &m)) {
				sv_resp_error(q, SV_NAK_REM_ACCESS, h->psn);
				return;
			}
			q->epsn = (q->epsn + m) & SV_PSN_MASK;
			return;
		}
		if (h->va & 7) {
			sv_resp_error(q, SV_NAK_INV_REQ, h->psn);
			return;
		}
		uint64_t *p = NULL;
		if (sv_qp_allows(q, IBV_ACCESS_REMOTE_ATOMIC))
			p = (uint64_t *)sv_mr_remote(q->ctx, q->pd, h->rkey, h->va, 8, IBV_ACCESS_REMOTE_ATOMIC);
		if (!p) {
			sv_resp_error(q, SV_NAK_REM_ACCESS, h->psn);
			return;
		}
		uint64_t orig;
		if (h->op == SV_OP_CMP_SWP) {
			orig = h->data1;
			__atomic_compare_exchange_n(p, &orig, h->data0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
		} else {
			orig = __atomic_fetch_add(p, h->data0, __ATOMIC_SEQ_CST);
		}
		q->acache[q->acache_next].psn = h->psn;
		q->acache[q->acache_next].orig = orig;
		q->acache[q->acache_next].valid = 1;
		q->acache_next = (q->acache_next + 1) % SV_ACACHE;
		q->epsn = (q->epsn + 1) & SV_PSN_MASK;
		sv_atomic_reply(q, h->psn, orig);
		return;
	}
	if (first) {
		int imm = !write || (h->flags & SV_FLAG_IMM) || h->op == SV_OP_WRITE_ONLY_IMM;
		if (write) {
			uint8_t *dst = NULL;
			if (h->dlen > SV_MAX_MSG) {
				sv_resp_error(q, SV_NAK_INV_REQ, h->psn);
				return;
			}
			if (h->dlen) {
				if (sv_qp_allows(q, IBV_ACCESS_REMOTE_WRITE))
					dst = sv_mr_remote(q->ctx, q->pd, h->rkey, h->va, h->dlen,
							   IBV_ACCESS_REMOTE_WRITE);
				if (!dst) {
					sv_resp_error(q, SV_NAK_REM_ACCESS, h->psn);
					return;
				}
			}
			q->wr_ptr = dst;
			q->wr_len = h->dlen;
		}
		if (imm && sv_rq_empty(q)) {
			/* a SEND, or a WRITE with immediate, needs a RECV */
			q->nak_sent = 1;
			sv_count(q->ctx->dev, SV_CNT_RNR_NAK_SENT);
			sv_send_ctl(q, SV_OP_NAK, SV_NAK_RNR, q->attr.min_rnr_timer, h->psn);
			return;
		}
		if (imm)
			sv_rq_take(q);
		q->in_msg = 1;
		q->msg_write = write;
		q->msg_imm = write && imm;
		q->msg_off = 0;
	}
	q->nak_sent = 0;
	if (write) {
		if ((uint64_t)q->msg_off + h->len > q->wr_len || (last && q->msg_off + h->len != q->wr_len)) {
			/* more or less data than the WRITE announced */
			if (q->msg_imm)
				sv_rq_done(q, IBV_WC_REM_INV_REQ_ERR, q->msg_off, h);
			q->in_msg = 0;
			sv_resp_error(q, SV_NAK_INV_REQ, h->psn);
			return;
		}
		if (h->len)
			memcpy(q->wr_ptr + q->msg_off, payload, h->len);
	} else {
		struct sv_rwqe *w = sv_rq_cur(q);
		enum ibv_wc_status st = sv_scatter(q, w->sge, w->nsge, q->msg_off, payload, h->len);
		if (st != IBV_WC_SUCCESS) {
			sv_rq_done(q, st, q->msg_off, h);
			q->in_msg = 0;
			sv_send_ctl(q, SV_OP_NAK, st == IBV_WC_LOC_LEN_ERR ? SV_NAK_INV_REQ : SV_NAK_REM_OP, 0, h->psn);
			sv_qp_error(q);
			return;
		}
	}
	q->msg_off += h->len;
	q->epsn = (q->epsn + 1) & SV_PSN_MASK;
	if (last) {
		if (!write || q->msg_imm)
			sv_rq_done(q, IBV_WC_SUCCESS, q->msg_off, h);
		q->in_msg = 0;
		sv_ack_later(q, h->psn);
	} else if ((h->psn & (SV_ACK_EVERY - 1)) == SV_ACK_EVERY - 1) {
		/* inside a long message, ACK now and then so that the requester's window moves */
		sv_ack_later(q, h->psn);
	}
}

/* sv_on_response is the requester's side of READ responses and atomic ACKs: in order, for
 * the oldest outstanding WQE, each one also acknowledging what precedes it. */
static void sv_on_response(struct sv_qp *q, const struct sv_hdr *h, const uint8_t *payload, int64_t now)
{
	if (!sv_inflight(q) || sv_psn_diff(h->psn, q->next_psn) >= 0)
		return;
	sv_ack(q, (h->psn - 1) & SV_PSN_MASK, now);
	if (!sv_inflight(q))
		return;
	struct sv_swqe *w = &q->sq[q->sq_done % q->sq_cap];
	uint32_t asked = q->sq_done == q->sq_send ? q->sq_pkt : w->npkts;
	if (!sv_is_rd(w) || (h->op == SV_OP_ATOMIC_ACK) != (w->op != IBV_WR_RDMA_READ) ||
	    h->psn != ((w->first_psn + w->rd_got) & SV_PSN_MASK) || w->rd_got >= asked)
		return; /* a duplicate, or one after a lost response: the timer recovers */
	enum ibv_wc_status st;
	if (h->op == SV_OP_ATOMIC_ACK) {
		uint64_t v = h->data0;
		st = sv_scatter(q, w->sge, w->nsge, 0, (const uint8_t *)&v, 8);
	} else {
		uint32_t off = w->rd_got * q->mtu_bytes;
		uint32_t want = w->len - off < q->mtu_bytes ? w->len - off : q->mtu_bytes;
		if (h->len != want)
			return;
		st = sv_scatter(q, w->sge, w->nsge, off, payload, h->len);
	}
	if (st != IBV_WC_SUCCESS) {
		sv_fail(q, st); /* the local buffer's MR went away since the post */
		return;
	}
	w->rd_got++;
	if (sv_ack(q, h->psn, now))
		sv_pump(q, now);
}

static void sv_check_overrun(struct sv_qp *q)
{
	if (!q->overrun)
		return;
	q->overrun = 0;
	if (q->state != IBV_QPS_ERR) {
		sv_async_push(q->ctx, IBV_EVENT_QP_FATAL, q, 0);
		sv_qp_error(q);
	}
	q->overrun = 0;
}

/* sv_on_packet handles one decoded packet for q; buf is its datagram, ref the payload of an
 * SV_FLAG_REF packet when already read (NULL: read when needed). */
static void sv_on_packet(struct sv_qp *q, const struct sv_hdr *hp, const uint8_t *buf, const uint8_t *ref,
			 int64_t now)
{
	struct sv_hdr h = *hp;
	if (h.dqpn != q->qp.qp_num)
		return;
	if (!sv_port_active(q->ctx)) {
		sv_count(q->ctx->dev, SV_CNT_RX_DROPPED);
		return;
	}
	sv_count(q->ctx->dev, SV_CNT_RX_PACKETS);
	const uint8_t *payload = h.flags & SV_FLAG_REF ? ref : buf + SV_HDR_LEN + sv_ext_len(h.op);
	int ud = q->qp.qp_type == IBV_QPT_UD;
	if (h.op == SV_OP_UD_SEND || h.op == SV_OP_UD_SEND_IMM) {
		if (ud)
			sv_ud_recv(q, &h, payload);
	} else if (ud) {
		/* a connected QP's packet: not for a UD QP */
	} else if (sv_op_is_request(h.op)) {
		sv_on_request(q, &h, payload);
	} else if ((q->state == IBV_QPS_RTS || q->state == IBV_QPS_SQD) && q->qp.qp_type == IBV_QPT_RC) {
		if (h.op == SV_OP_ACK) {
			if (sv_ack(q, h.psn, now))
				sv_pump(q, now);
		} else if (h.op == SV_OP_NAK) {
			sv_on_nak(q, &h, now);
		} else {
			sv_on_response(q, &h, payload, now);
		}
	}
	sv_check_overrun(q);
}

static void sv_timers(struct sv_ctx *c, int64_t now)
{
	for (struct sv_qp *q = c->qlist; q; q = q->next) {
		if (q->state != IBV_QPS_RTS && q->state != IBV_QPS_SQD)
			continue;
		if (q->resume_at && now >= q->resume_at) {
			q->resume_at = 0;
			sv_pump(q, now);
		}
		if (q->ack_deadline && now >= q->ack_deadline) {
			q->ack_deadline = 0;
			if (!sv_inflight(q))
				continue;
			sv_count(c->dev, SV_CNT_ACK_TIMEOUT);
			if (++q->retries > q->attr.retry_cnt) {
				sv_fail(q, IBV_WC_RETRY_EXC_ERR);
			} else {
				sv_rewind(q);
				sv_pump(q, now);
			}
		}
		sv_check_overrun(q);
	}
}

static int64_t sv_next_deadline(struct sv_ctx *c)
{
	int64_t dl = INT64_MAX;
	for (struct sv_qp *q = c->qlist; q; q = q->next) {
		if (q->ack_deadline && q->ack_deadline < dl)
			dl = q->ack_deadline;
		if (q->resume_at && q->resume_at < dl)
			dl = q->resume_at;
	}
	return dl;
}

/* sv_faults_apply raises the events of the device's changes this context has not seen yet:
 * DEVICE_FATAL once (every QP to ERR, flushed), PORT_ERR / PORT_ACTIVE for each port change
 * (a down-and-up flap between two looks gives both). */
static void sv_faults_apply(struct sv_ctx *c)
{
	struct sv_dev *d = c->dev;
	pthread_mutex_lock(&sv_glock);
	int port_down = d->faults.port_down;
	uint32_t port_gen = d->port_gen;
	pthread_mutex_unlock(&sv_glock);
	if (sv_dead(c) && !c->fatal) {
		c->fatal = 1;
		sv_async_push(c, IBV_EVENT_DEVICE_FATAL, NULL, 0);
		for (struct sv_qp *q = c->qlist; q; q = q->next) {
			sv_qp_error(q);
			sv_check_overrun(q);
		}
	}
	if (c->fatal || port_gen == c->port_gen)
		return;
	if (port_down == c->port_down)
		sv_async_push(c, port_down ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR, NULL, 1);
	sv_async_push(c, port_down ? IBV_EVENT_PORT_ERR : IBV_EVENT_PORT_ACTIVE, NULL, 1);
	c->port_down = port_down;
	c->port_gen = port_gen;
}

/* sv_rx reads the sockets epoll reported ready and handles their packets, up to 64 per QP
 * per call, SV_RX_BATCH per recvmmsg (a message of many path-MTU packets costs a few system
 * calls, not one each). Context lock held. Only the progress thread consumes its wake-up
 * eventfd (a consumer's inline progress must leave it readable, or the thread would sleep
 * through a new deadline). */

static void sv_rx(struct sv_ctx *c, const struct epoll_event *evs, int n, int thread)
{
	/* + 1: a datagram longer than any packet fills the buffer and fails sv_decode */
	static __thread uint8_t bufs[SV_RX_BATCH][SV_MAX_HDR + SV_MAX_PAYLOAD + 1];
	struct iovec iov[SV_RX_BATCH];
	struct mmsghdr mm[SV_RX_BATCH];
	struct sockaddr_in src[SV_RX_BATCH];
	int64_t now = sv_now_ns();
	if (!c->rxs && !(c->rxs = malloc(sizeof(*c->rxs))))
		return; /* the packets wait in their sockets */
	struct sv_rxs *x = c->rxs;
	for (int i = 0; i < n; i++) {
		uint32_t id = evs[i].data.u32;
		if (id == SV_WAKE_ID) {
			if (thread)
				sv_evfd_clear(c->wakefd);
			continue;
		}
		for (int k = 0; k < 64 / SV_RX_BATCH; k++) {
			struct sv_qp *q = c->qps[id];
			if (!q)
				break;
			for (int j = 0; j < SV_RX_BATCH; j++) {
				iov[j] = (struct iovec){.iov_base = bufs[j], .iov_len = sizeof(bufs[j])};
				mm[j] = (struct mmsghdr){.msg_hdr = {.msg_name = &src[j], .msg_namelen = sizeof(src[j]),
								     .msg_iov = &iov[j], .msg_iovlen = 1}};
			}
			int r = recvmmsg(q->fd, mm, SV_RX_BATCH, MSG_DONTWAIT, NULL);
			if (r <= 0)
				break;
			/* the packets, a train of references taken apart; a reference is taken only
			 * from the QP's peer (its socket, which only the peer's process holds), never
			 * from another sender on the host */
			int np = 0;
			for (int j = 0; j < r; j++) {
				size_t off = 0, used;
				int peer = mm[j].msg_hdr.msg_namelen == sizeof(src[j]) &&
					   src[j].sin_addr.s_addr == q->dest.sin_addr.s_addr &&
					   src[j].sin_port == q->dest.sin_port;
				while (off < mm[j].msg_len && np < SV_RX_PKTS &&
				       !sv_decode_next(bufs[j] + off, mm[j].msg_len - off, &x->h[np], &used)) {
					off += used;
					if ((x->h[np].flags & SV_FLAG_REF) && !peer)
						continue;
					x->buf[np++] = bufs[j] + off - used;
				}
			}
			for (int s = 0, e; s < np && c->qps[id] == q; s = e) {
				e = s + sv_ref_prefetch(q, x, x->h + s, np - s, x->ref + s);
				for (int j = s; j < e && c->qps[id] == q; j++)
					sv_on_packet(q, &x->h[j], x->buf[j], x->ref[j], now);
			}
			if (c->qps[id] == q)
				sv_ack_flush(q);
			if (r < SV_RX_BATCH)
				break;
		}
	}
}

static void *sv_thread(void *arg)
{
	struct sv_ctx *c = arg;
	struct epoll_event evs[32];
	int64_t next_ctl = 0;

	pthread_mutex_lock(&c->lk);
	for (;;) {
		if (c->stop)
			break;
		int64_t now = sv_now_ns();
		if (sv_cfg.ctl[0] && now >= next_ctl) {
			pthread_mutex_unlock(&c->lk);
			sv_ctl_reload();
			pthread_mutex_lock(&c->lk);
			next_ctl = now + 100 * 1000000LL;
		}
		sv_faults_apply(c);
		sv_timers(c, now);
		int64_t dl = sv_next_deadline(c);
		if (sv_cfg.ctl[0] && next_ctl < dl)
			dl = next_ctl;
		/* A consumer busy-polling (several empty polls in a row, no CQ armed since, the
		 * last within SV_POLL_HOLD_NS) reads the sockets: wait for the timers and wakefd
		 * only, and look again within SV_POLL_HOLD_NS (a poller that stops leaves the
		 * packets to the thread at most that much later). leave_rx is set before the
		 * streak is read again, and sv_req_notify_cq clears the streak before it reads
		 * leave_rx: one of the two sees the other, so an arming is never missed. */
		int64_t ps = __atomic_load_n(&c->poll_ns, __ATOMIC_RELAXED);
		if (SV_POLL_HOLD_NS > 0 && __atomic_load_n(&c->poll_streak, __ATOMIC_RELAXED) >= SV_POLL_STREAK &&
		    now - ps < SV_POLL_HOLD_NS) {
			__atomic_store_n(&c->leave_rx, 1, __ATOMIC_SEQ_CST);
			if (__atomic_load_n(&c->poll_streak, __ATOMIC_SEQ_CST) >= SV_POLL_STREAK) {
				int64_t until = ps + SV_POLL_HOLD_NS < dl ? ps + SV_POLL_HOLD_NS : dl;
				c->sleep_until = until;
				pthread_mutex_unlock(&c->lk);
				int64_t d = until - now;
				struct timespec ts = {d > 0 ? d / 1000000000 : 0, d > 0 ? d % 1000000000 : 0};
				struct pollfd pfd = {.fd = c->wakefd, .events = POLLIN};
				int woke = ppoll(&pfd, 1, &ts, NULL);
				pthread_mutex_lock(&c->lk);
				__atomic_store_n(&c->leave_rx, 0, __ATOMIC_SEQ_CST);
				c->sleep_until = 0;
				if (woke > 0)
					sv_evfd_clear(c->wakefd);
				continue;
			}
			__atomic_store_n(&c->leave_rx, 0, __ATOMIC_SEQ_CST);
		}
		c->sleep_until = dl;
		pthread_mutex_unlock(&c->lk);
		int ms = -1;
		if (dl != INT64_MAX) {
			int64_t d = dl - now;
			ms = d <= 0 ? 0 : (int)((d + 999999) / 1000000);
		}
		int n = epoll_wait(c->epfd, evs, 32, ms);
		pthread_mutex_lock(&c->lk);
		c->sleep_until = 0;
		sv_rx(c, evs, n, 1);
	}
	pthread_mutex_unlock(&c->lk);
	return NULL;
}

/* ---- QPs ---- */

/* sv_token is the next SV_FLAG_REF token of the context (never 0). Context lock held. */
static uint64_t sv_token(struct sv_ctx *c)
{
	uint64_t z = (c->tok_next += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	z ^= z >> 31;
	return z ? z : 1;
}

static int sv_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	if (!ibqp || !wr) {
		if (bad_wr)
			*bad_wr = wr;
		return EINVAL;
	}
	struct sv_qp *q = (struct sv_qp *)ibqp;
	struct sv_ctx *c = q->ctx;
	int rc = 0;
	pthread_mutex_lock(&c->lk);
	for (; wr; wr = wr->next) {
		enum ibv_wr_opcode op = wr->opcode;
		if (!q->sq_open) {
			rc = EINVAL; /* before RTS: the IB spec's immediate error, as mlx5 */
			break;
		}
		int rd = op == IBV_WR_RDMA_READ || op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD;
		int atomic = op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD;
		if ((op != IBV_WR_SEND && op != IBV_WR_SEND_WITH_IMM && op != IBV_WR_RDMA_WRITE &&
		     op != IBV_WR_RDMA_WRITE_WITH_IMM && !rd) ||
		    (rd && ibqp->qp_type == IBV_QPT_UC) ||
		    (ibqp->qp_type == IBV_QPT_UD && op != IBV_WR_SEND && op != IBV_WR_SEND_WITH_IMM) ||
		    (ibqp->qp_type == IBV_QPT_UD && !wr->wr.ud.ah)) {
			rc = EINVAL;
			break;
		}
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > q->cap.max_send_sge || (wr->num_sge && !wr->sg_list)) {
			rc = EINVAL;
			break;
		}
		uint64_t total = 0;
		for (int i = 0; i < wr->num_sge; i++)
			total += wr->sg_list[i].length;
		/* an atomic returns 8 bytes into one SGE */
		if (atomic && (wr->num_sge != 1 || total != 8)) {
			rc = EINVAL;
			break;
		}
		int inl = !rd && (wr->send_flags & IBV_SEND_INLINE);
		if (inl && total > q->cap.max_inline_data) {
			rc = EINVAL;
			break;
		}
		/* a UD message is one packet: at most the port's MTU */
		if (ibqp->qp_type == IBV_QPT_UD && total > (128u << sv_cfg.active_mtu)) {
			rc = EINVAL;
			break;
		}
		if (q->sq_tail - __atomic_load_n(&q->sq_released, __ATOMIC_ACQUIRE) >= q->sq_cap) {
			rc = ENOMEM;
			break;
		}
		struct sv_swqe *w = &q->sq[q->sq_tail % q->sq_cap];
		sv_swqe_free(w);
		memset(w, 0, sizeof(*w));
		w->wr_id = wr->wr_id;
		w->op = op;
		w->signaled = q->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
		w->solicited = !!(wr->send_flags & IBV_SEND_SOLICITED);
		w->fence = !!(wr->send_flags & IBV_SEND_FENCE);
		w->imm_valid = op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM;
		w->imm = w->imm_valid ? wr->imm_data : 0;
		if (atomic) {
			w->rva = wr->wr.atomic.remote_addr;
			w->rkey = wr->wr.atomic.rkey;
			w->swap = op == IBV_WR_ATOMIC_CMP_AND_SWP ? wr->wr.atomic.swap : wr->wr.atomic.compare_add;
			w->cmp = op == IBV_WR_ATOMIC_CMP_AND_SWP ? wr->wr.atomic.compare_add : 0;
		} else if (op != IBV_WR_SEND && op != IBV_WR_SEND_WITH_IMM) {
			w->rva = wr->wr.rdma.remote_addr;
			w->rkey = wr->wr.rdma.rkey;
		}
		if (ibqp->qp_type == IBV_QPT_UD) {
			const struct sv_ah *ah = (const struct sv_ah *)wr->wr.ud.ah;
			w->udest = ah->dest;
			w->udest.sin_port = htons((uint16_t)wr->wr.ud.remote_qpn);
			/* a Q_Key with the high bit set means the QP's own */
			w->qkey = (wr->wr.ud.remote_qkey & 0x80000000u) ? q->attr.qkey : wr->wr.ud.remote_qkey;
			w->grh = ah->grh;
			memcpy(w->sgid, ah->sgid.raw, 16);
			memcpy(w->dgid, ah->dgid.raw, 16);
		}
		if (total > SV_MAX_MSG) {
			w->pre = IBV_WC_LOC_LEN_ERR;
		} else {
			/* a READ or an atomic writes into its SGEs: they need LOCAL_WRITE */
			int need = rd ? IBV_ACCESS_LOCAL_WRITE : 0;
			for (int i = 0; !inl && i < wr->num_sge; i++) {
				struct ibv_sge *s = &wr->sg_list[i];
				if (s->length && sv_mr_check(c, q->pd, s->lkey, s->addr, s->length, need)) {
					w->pre = IBV_WC_LOC_PROT_ERR;
					break;
				}
			}
		}
		if (!w->pre && rd && wr->num_sge) {
			w->sge = malloc((size_t)wr->num_sge * sizeof(*w->sge));
			if (!w->sge) {
				rc = ENOMEM;
				break;
			}
			memcpy(w->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(*w->sge));
			w->nsge = wr->num_sge;
		} else if (!w->pre && total) {
			w->blk = malloc(SV_BLK_HDR + total);
			if (!w->blk) {
				rc = ENOMEM;
				break;
			}
			w->data = w->blk + SV_BLK_HDR;
			uint64_t tok = sv_token(c);
			__atomic_store_n((uint64_t *)w->blk, tok, __ATOMIC_RELEASE);
			uint64_t off = 0;
			for (int i = 0; i < wr->num_sge; i++) {
				memcpy(w->data + off, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
				off += wr->sg_list[i].length;
			}
		}
		w->len = (uint32_t)(total > SV_MAX_MSG ? 0 : total);
		uint32_t idx = q->sq_tail++;
		if (q->state == IBV_QPS_ERR) {
			/* Posted in ERR: flushed at once. */
			w->signaled = 1;
			sv_complete_send(q, idx, IBV_WC_WR_FLUSH_ERR);
			sv_swqe_free(w);
			q->sq_done = q->sq_send = q->sq_tail;
		}
	}
	if (q->state == IBV_QPS_RTS)
		sv_pump(q, sv_now_ns());
	sv_check_overrun(q);
	pthread_mutex_unlock(&c->lk);
	if (rc) {
		if (bad_wr)
			*bad_wr = wr;
		errno = rc;
	}
	return rc;
}

static int sv_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	if (!ibqp || !wr) {
		if (bad_wr)
			*bad_wr = wr;
		return EINVAL;
	}
	struct sv_qp *q = (struct sv_qp *)ibqp;
	struct sv_ctx *c = q->ctx;
	int rc = 0;
	pthread_mutex_lock(&c->lk);
	for (; wr; wr = wr->next) {
		if (!q->rq_open || q->srq || wr->num_sge < 0 || (uint32_t)wr->num_sge > q->cap.max_recv_sge ||
		    (wr->num_sge && !wr->sg_list)) {
			rc = EINVAL;
			break;
		}
		if (q->rq_tail - __atomic_load_n(&q->rq_released, __ATOMIC_ACQUIRE) >= q->rq_cap) {
			rc = ENOMEM;
			break;
		}
		struct sv_rwqe *w = &q->rq[q->rq_tail % q->rq_cap];
		w->wr_id = wr->wr_id;
		w->nsge = wr->num_sge;
		if (wr->num_sge)
			memcpy(w->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(*w->sge));
		uint32_t idx = q->rq_tail++;
		if (q->state == IBV_QPS_ERR) {
			sv_complete_recv(q, idx, IBV_WC_WR_FLUSH_ERR, 0, NULL);
			q->rq_head = q->rq_tail;
		}
	}
	sv_check_overrun(q);
	pthread_mutex_unlock(&c->lk);
	if (rc) {
		if (bad_wr)
			*bad_wr = wr;
		errno = rc;
	}
	return rc;
}

SV_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *ibpd, struct ibv_qp_init_attr *a)
{
	if (!ibpd || !a || !a->send_cq || !a->recv_cq || a->send_cq->context != ibpd->context ||
	    a->recv_cq->context != ibpd->context) {
		errno = EINVAL;
		return NULL;
	}
	if (a->qp_type != IBV_QPT_RC && a->qp_type != IBV_QPT_UC && a->qp_type != IBV_QPT_UD) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (a->srq && a->srq->context != ibpd->context) {
		errno = EINVAL;
		return NULL;
	}
	struct ibv_qp_cap cap = a->cap;
	if (a->srq)
		cap.max_recv_wr = cap.max_recv_sge = 0; /* its RECVs are the SRQ's */
	if (cap.max_send_wr > SV_MAX_QP_WR || cap.max_recv_wr > SV_MAX_QP_WR || cap.max_send_sge > SV_MAX_SGE ||
	    cap.max_recv_sge > SV_MAX_SGE || cap.max_inline_data > SV_MAX_INLINE) {
		errno = EINVAL;
		return NULL;
	}
	struct sv_ctx *c = sv_ctx(ibpd->context);
	if (sv_dead(c)) {
		errno = EIO;
		return NULL;
	}
	cap.max_send_wr = cap.max_send_wr ? sv_pow2(cap.max_send_wr) : 0;
	cap.max_recv_wr = cap.max_recv_wr ? sv_pow2(cap.max_recv_wr) : 0;
	struct sv_qp *q = calloc(1, sizeof(*q));
	if (!q) {
		errno = ENOMEM;
		return NULL;
	}
	q->sq_cap = cap.max_send_wr ? cap.max_send_wr : 1;
	q->rq_cap = cap.max_recv_wr ? cap.max_recv_wr : 1;
	q->sq = calloc(q->sq_cap, sizeof(*q->sq));
	q->rq = calloc(q->rq_cap, sizeof(*q->rq));
	q->rq_sge = calloc((size_t)q->rq_cap * (cap.max_recv_sge ? cap.max_recv_sge : 1), sizeof(*q->rq_sge));
	if (a->srq) {
		q->srq = (struct sv_srq *)a->srq;
		q->srq_cur_sge = calloc(q->srq->max_sge ? q->srq->max_sge : 1, sizeof(*q->srq_cur_sge));
		q->srq_cur.sge = q->srq_cur_sge;
	}
	q->fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (!q->sq || !q->rq || !q->rq_sge || (q->srq && !q->srq_cur_sge) || q->fd < 0)
		goto fail;
	for (uint32_t i = 0; i < q->rq_cap; i++)
		q->rq[i].sge = q->rq_sge + (size_t)i * (cap.max_recv_sge ? cap.max_recv_sge : 1);
	int sz = 1 << 20;
	setsockopt(q->fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
	setsockopt(q->fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	struct sockaddr_in sa = {.sin_family = AF_INET};
	memcpy(&sa.sin_addr, c->dev->ip, 4);
	if (bind(q->fd, (struct sockaddr *)&sa, sizeof(sa))) {
		sa.sin_addr.s_addr = htonl(INADDR_ANY);
		if (bind(q->fd, (struct sockaddr *)&sa, sizeof(sa)))
			goto fail;
	}
	socklen_t sl = sizeof(sa);
	if (getsockname(q->fd, (struct sockaddr *)&sa, &sl))
		goto fail;
	/* The QPN is the UDP port: peers address a QP by its GID's IPv4 address and its QPN. */
	uint32_t qpn = ntohs(sa.sin_port);
	q->ctx = c;
	q->pd = (struct sv_pd *)ibpd;
	q->scq = (struct sv_cq *)a->send_cq;
	q->rcq = (struct sv_cq *)a->recv_cq;
	q->cap = cap;
	q->sq_sig_all = a->sq_sig_all;
	q->state = IBV_QPS_RESET;
	q->qp.context = ibpd->context;
	q->qp.qp_context = a->qp_context;
	q->qp.pd = ibpd;
	q->qp.send_cq = a->send_cq;
	q->qp.recv_cq = a->recv_cq;
	q->qp.srq = a->srq;
	q->qp.handle = qpn;
	q->qp.qp_num = qpn;
	q->qp.state = IBV_QPS_RESET;
	q->qp.qp_type = a->qp_type;
	pthread_mutex_init(&q->qp.mutex, NULL);
	pthread_cond_init(&q->qp.cond, NULL);
	q->mtu_bytes = a->qp_type == IBV_QPT_UD ? 128u << sv_cfg.active_mtu : 1024;
	pthread_mutex_lock(&c->lk);
	if (c->qps[qpn]) {
		pthread_mutex_unlock(&c->lk);
		goto fail;
	}
	struct epoll_event ev = {.events = EPOLLIN, .data.u32 = qpn};
	if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, q->fd, &ev)) {
		pthread_mutex_unlock(&c->lk);
		goto fail;
	}
	c->qps[qpn] = q;
	q->next = c->qlist;
	c->qlist = q;
	q->scq->nqp++;
	q->rcq->nqp++;
	q->pd->refs++;
	if (q->srq)
		q->srq->nqp++;
	pthread_mutex_unlock(&c->lk);
	a->cap = cap;
	return &q->qp;
fail:;
	int e = errno ? errno : ENOMEM;
	if (q->fd >= 0)
		close(q->fd);
	free(q->sq);
	free(q->rq);
	free(q->rq_sge);
	free(q->srq_cur_sge);
	free(q);
	errno = e;
	return NULL;
}

SV_EXPORT int ibv_destroy_qp(struct ibv_qp *ibqp)
{
	if (!ibqp)
		return EINVAL;
	struct sv_qp *q = (struct sv_qp *)ibqp;
	struct sv_ctx *c = q->ctx;
	pthread_mutex_lock(&c->lk);
	c->qps[ibqp->qp_num] = NULL;
	for (struct sv_qp **pp = &c->qlist; *pp; pp = &(*pp)->next)
		if (*pp == q) {
			*pp = q->next;
			break;
		}
	epoll_ctl(c->epfd, EPOLL_CTL_DEL, q->fd, NULL);
	close(q->fd);
	sv_async_drop(c, q);
	pthread_mutex_unlock(&c->lk);
	sv_cq_clean(q->scq, q);
	if (q->rcq != q->scq)
		sv_cq_clean(q->rcq, q);
	pthread_mutex_lock(&c->lk);
	q->scq->nqp--;
	q->rcq->nqp--;
	q->pd->refs--;
	if (q->srq)
		q->srq->nqp--;
	pthread_mutex_unlock(&c->lk);
	pthread_mutex_lock(&ibqp->mutex);
	while (ibqp->events_completed != __atomic_load_n(&q->ev_reported, __ATOMIC_SEQ_CST))
		pthread_cond_wait(&ibqp->cond, &ibqp->mutex);
	pthread_mutex_unlock(&ibqp->mutex);
	for (uint32_t i = 0; i < q->sq_cap; i++)
		sv_swqe_free(&q->sq[i]);
	free(q->sq);
	free(q->rq);
	free(q->rq_sge);
	free(q->srq_cur_sge);
	sv_pw_clear(q);
	free(q->pw);
	free(q);
	return 0;
}

/* The IB spec's RC attribute rules (as the kernel's qp_state_table has them). */
struct sv_trans {
	int valid;
	int req, opt;
};

static struct sv_trans sv_rule(enum ibv_qp_state cur, enum ibv_qp_state next)
{
	struct sv_trans t = {0, 0, 0};
	if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) {
		t.valid = 1;
		return t;
	}
	switch (cur) {
	case IBV_QPS_RESET:
		if (next == IBV_QPS_INIT)
			t = (struct sv_trans){1, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0};
		break;
	case IBV_QPS_INIT:
		if (next == IBV_QPS_INIT)
			t = (struct sv_trans){1, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS};
		else if (next == IBV_QPS_RTR)
			t = (struct sv_trans){1,
					      IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
						      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
					      IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX};
		break;
	case IBV_QPS_RTR:
		if (next == IBV_QPS_RTS)
			t = (struct sv_trans){1,
					      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RNR_RETRY |
						      IBV_QP_RETRY_CNT | IBV_QP_TIMEOUT,
					      IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS |
						      IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE};
		break;
	case IBV_QPS_RTS:
		if (next == IBV_QPS_RTS)
			t = (struct sv_trans){1, 0,
					      IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH |
						      IBV_QP_PATH_MIG_STATE | IBV_QP_MIN_RNR_TIMER};
		else if (next == IBV_QPS_SQD)
			t = (struct sv_trans){1, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY};
		break;
	case IBV_QPS_SQD:
		if (next == IBV_QPS_RTS)
			t = (struct sv_trans){1, 0,
					      IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS |
						      IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE};
		else if (next == IBV_QPS_SQD)
			t = (struct sv_trans){1, 0,
					      IBV_QP_PORT | IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
						      IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC |
						      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS |
						      IBV_QP_PKEY_INDEX | IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE};
		break;
	default:
		break;
	}
	return t;
}

/* The IB spec's UD attribute rules. */
static struct sv_trans sv_rule_ud(enum ibv_qp_state cur, enum ibv_qp_state next)
{
	struct sv_trans t = {0, 0, 0};
	if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) {
		t.valid = 1;
		return t;
	}
	const int P = IBV_QP_PKEY_INDEX, Q = IBV_QP_QKEY, C = IBV_QP_CUR_STATE;
	if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT)
		t = (struct sv_trans){1, P | IBV_QP_PORT | Q, 0};
	else if (cur == IBV_QPS_INIT && next == IBV_QPS_INIT)
		t = (struct sv_trans){1, 0, P | IBV_QP_PORT | Q};
	else if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR)
		t = (struct sv_trans){1, 0, P | Q};
	else if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS)
		t = (struct sv_trans){1, IBV_QP_SQ_PSN, C | Q};
	else if ((cur == IBV_QPS_RTS || cur == IBV_QPS_SQD) && next == IBV_QPS_RTS)
		t = (struct sv_trans){1, 0, C | Q};
	else if (cur == IBV_QPS_RTS && next == IBV_QPS_SQD)
		t = (struct sv_trans){1, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY};
	else if (cur == IBV_QPS_SQD && next == IBV_QPS_SQD)
		t = (struct sv_trans){1, 0, P | Q};
	return t;
}

/* sv_ip_is_local: a on this host (loopback, or an address of one of its interfaces), so
 * that a QP's peer may be read with process_vm_readv. */
static int sv_ip_is_local(struct in_addr a)
{
	if ((ntohl(a.s_addr) >> 24) == 127)
		return 1;
	struct ifaddrs *ifs, *i;
	int local = 0;
	if (getifaddrs(&ifs))
		return 0;
	for (i = ifs; i && !local; i = i->ifa_next)
		local = i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
			((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == a.s_addr;
	freeifaddrs(ifs);
	return local;
}

/* sv_resolve checks an address vector as the kernel's address resolution would and gives the
 * UDP destination of dest_qpn. */
static int sv_resolve(const struct sv_dev *d, const struct ibv_ah_attr *ah, uint32_t dest_qpn,
		      struct sockaddr_in *out)
{
	uint8_t ip[4];
	if (ah->port_num > 1)
		return EINVAL;
	if (!ah->is_global) {
		if (!sv_cfg.ib)
			return EINVAL; /* RoCE needs a GRH */
		if (ah->dlid == 0 || ah->dlid >= 0xc000)
			return EINVAL;
		/* IB mode without a GRH reaches this host only: the device with that LID, else this
		 * device itself. */
		memcpy(ip, d->ip, 4);
		for (int i = 0; i < sv_ndevs; i++)
			if (sv_devs[i].lid == ah->dlid)
				memcpy(ip, sv_devs[i].ip, 4);
	} else {
		struct sv_gid s;
		if (sv_gid_at(d, ah->grh.sgid_index, &s))
			return EINVAL; /* out of range or empty */
		if (sv_gid_is_v4mapped(&s.gid) != sv_gid_is_v4mapped(&ah->grh.dgid))
			return EINVAL;
		if (sv_gid_ipv4(&ah->grh.dgid, ip))
			return EHOSTUNREACH;
	}
	memset(out, 0, sizeof(*out));
	out->sin_family = AF_INET;
	memcpy(&out->sin_addr, ip, 4);
	out->sin_port = htons((uint16_t)dest_qpn);
	if (dest_qpn == 0 || dest_qpn > 0xffff)
		return EHOSTUNREACH; /* no softverbs QP has that number */
	return 0;
}

SV_EXPORT int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask)
{
	if (!ibqp || !attr)
		return EINVAL;
	struct sv_qp *q = (struct sv_qp *)ibqp;
	struct sv_ctx *c = q->ctx;
	struct sv_faults f;
	if ((mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RTR)
		sv_ctl_reload(); /* RTR faults apply from the next call on */
	sv_faults_snapshot(c->dev, &f);
	pthread_mutex_lock(&c->lk);
	enum ibv_qp_state cur = q->state;
	int rc = EINVAL;
	if ((mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != cur)
		goto out;
	enum ibv_qp_state next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
	if ((unsigned)next > IBV_QPS_ERR || next == IBV_QPS_SQE)
		goto out;
	struct sv_trans t = sv_rule(cur, next);
	if (ibqp->qp_type == IBV_QPT_UD)
		t = sv_rule_ud(cur, next);
	if (ibqp->qp_type == IBV_QPT_UC) {
		/* UC has no ACKs, retries, RNR or RDMA reads: the IB spec's UC table is the RC one
		 * without their attributes */
		const int rc_only = IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER | IBV_QP_TIMEOUT |
				    IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
		t.req &= ~rc_only;
		t.opt &= ~rc_only;
	}
	if (!t.valid || (mask & t.req) != t.req || (mask & ~(t.req | t.opt | IBV_QP_STATE)))
		goto out;
	if ((mask & IBV_QP_PORT) && attr->port_num != 1)
		goto out;
	if ((mask & IBV_QP_PKEY_INDEX) && attr->pkey_index >= (sv_cfg.ib ? SV_PKEY_TBL_LEN_IB : SV_PKEY_TBL_LEN_ETH))
		goto out;
	if ((mask & IBV_QP_ACCESS_FLAGS) &&
	    (attr->qp_access_flags & ~(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				       IBV_ACCESS_REMOTE_ATOMIC)))
		goto out;
	if ((mask & IBV_QP_PATH_MTU) && (attr->path_mtu < IBV_MTU_256 || attr->path_mtu > IBV_MTU_4096))
		goto out;
	if ((mask & IBV_QP_DEST_QPN) && attr->dest_qp_num > SV_PSN_MASK)
		goto out;
	if ((mask & IBV_QP_TIMEOUT) && attr->timeout > 31)
		goto out;
	if ((mask & IBV_QP_RETRY_CNT) && attr->retry_cnt > 7)
		goto out;
	if ((mask & IBV_QP_RNR_RETRY) && attr->rnr_retry > 7)
		goto out;
	if ((mask & IBV_QP_MIN_RNR_TIMER) && attr->min_rnr_timer > 31)
		goto out;
	if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr->max_rd_atomic > SV_MAX_RD_ATOM)
		goto out;
	if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr->max_dest_rd_atomic > SV_MAX_RD_ATOM)
		goto out;
	struct sockaddr_in dest = q->dest;
	if (mask & IBV_QP_AV) {
		uint32_t dqpn = (mask & IBV_QP_DEST_QPN) ? attr->dest_qp_num : q->attr.dest_qp_num;
		rc = sv_resolve(c->dev, &attr->ah_attr, dqpn, &dest);
		if (rc)
			goto out;
		rc = EINVAL;
	}
	if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) {
		if (f.rtr_fail) {
			rc = f.rtr_fail;
			goto out;
		}
		if (f.rtr_delay_ms) {
			/* a slow address resolution (ARP): the call blocks, the QP stays as it is */
			pthread_mutex_unlock(&c->lk);
			struct timespec ts = {f.rtr_delay_ms / 1000, (long)(f.rtr_delay_ms % 1000) * 1000000};
			nanosleep(&ts, NULL);
			pthread_mutex_lock(&c->lk);
			if (q->state != cur)
				goto out;
		}
	}
	if (sv_dead(c) && next != IBV_QPS_RESET && next != IBV_QPS_ERR) {
		rc = EIO;
		goto out;
	}

	/* Apply. */
	struct ibv_qp_attr *s = &q->attr;
	if (mask & IBV_QP_PKEY_INDEX)
		s->pkey_index = attr->pkey_index;
	if (mask & IBV_QP_PORT)
		s->port_num = attr->port_num;
	if (mask & IBV_QP_ACCESS_FLAGS)
		s->qp_access_flags = attr->qp_access_flags;
	if (mask & IBV_QP_PATH_MTU)
		s->path_mtu = attr->path_mtu;
	if (mask & IBV_QP_DEST_QPN)
		s->dest_qp_num = attr->dest_qp_num;
	if (mask & IBV_QP_RQ_PSN)
		s->rq_psn = attr->rq_psn & SV_PSN_MASK;
	if (mask & IBV_QP_SQ_PSN)
		s->sq_psn = attr->sq_psn & SV_PSN_MASK;
	if (mask & IBV_QP_MAX_DEST_RD_ATOMIC)
		s->max_dest_rd_atomic = attr->max_dest_rd_atomic;
	if (mask & IBV_QP_MAX_QP_RD_ATOMIC)
		s->max_rd_atomic = attr->max_rd_atomic;
	if (mask & IBV_QP_MIN_RNR_TIMER)
		s->min_rnr_timer = attr->min_rnr_timer;
	if (mask & IBV_QP_TIMEOUT)
		s->timeout = attr->timeout;
	if (mask & IBV_QP_RETRY_CNT)
		s->retry_cnt = attr->retry_cnt;
	if (mask & IBV_QP_RNR_RETRY)
		s->rnr_retry = attr->rnr_retry;
	if (mask & IBV_QP_AV) {
		s->ah_attr = attr->ah_attr;
		q->dest = dest;
		q->samehost = q->qp.qp_type == IBV_QPT_RC && sv_cfg.samehost && sv_ip_is_local(dest.sin_addr);
	}
	if (mask & IBV_QP_ALT_PATH) {
		s->alt_ah_attr = attr->alt_ah_attr;
		s->alt_pkey_index = attr->alt_pkey_index;
		s->alt_port_num = attr->alt_port_num;
		s->alt_timeout = attr->alt_timeout;
	}
	if (mask & IBV_QP_PATH_MIG_STATE)
		s->path_mig_state = attr->path_mig_state;
	if (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY)
		s->en_sqd_async_notify = attr->en_sqd_async_notify;
	q->mtu_bytes = s->path_mtu >= IBV_MTU_256 && s->path_mtu <= IBV_MTU_4096 ? 128u << s->path_mtu : 1024;
	if (ibqp->qp_type == IBV_QPT_UD)
		q->mtu_bytes = 128u << sv_cfg.active_mtu;
	if (mask & IBV_QP_QKEY)
		s->qkey = attr->qkey;

	int64_t now = sv_now_ns();
	switch (next) {
	case IBV_QPS_RESET:
		/* Stop first (a QP in RESET takes no packet and makes no CQE), then clean its CQEs
		 * from the CQs, then reset the queues: a poll racing with this cannot then free
		 * slots of the new queues. */
		q->state = next;
		ibqp->state = next;
		pthread_mutex_unlock(&c->lk);
		sv_cq_clean(q->scq, q);
		if (q->rcq != q->scq)
			sv_cq_clean(q->rcq, q);
		pthread_mutex_lock(&c->lk);
		for (uint32_t i = 0; i < q->sq_cap; i++) {
			sv_swqe_free(&q->sq[i]);
		}
		q->sq_tail = q->sq_done = q->sq_send = q->sq_pkt = 0;
		__atomic_store_n(&q->sq_released, 0, __ATOMIC_RELEASE);
		q->rq_tail = q->rq_head = 0;
		__atomic_store_n(&q->rq_released, 0, __ATOMIC_RELEASE);
		q->ack_deadline = q->resume_at = 0;
		q->in_msg = q->nak_sent = 0;
		q->retries = q->rnr_retries = 0;
		q->overrun = 0;
		q->srq_have = 0;
		q->rq_open = q->sq_open = 0;
		memset(q->acache, 0, sizeof(q->acache));
		memset(&q->attr, 0, sizeof(q->attr));
		break;
	case IBV_QPS_ERR:
		sv_qp_error(q);
		break;
	case IBV_QPS_RTR:
		if (cur == IBV_QPS_INIT) {
			q->epsn = s->rq_psn;
			q->in_msg = q->nak_sent = 0;
		}
		q->state = next;
		break;
	case IBV_QPS_RTS:
		q->sq_open = 1;
		if (cur == IBV_QPS_RTR) {
			q->next_psn = s->sq_psn;
			q->acked_psn = (s->sq_psn - 1) & SV_PSN_MASK;
			q->retries = q->rnr_retries = 0;
		}
		q->state = next;
		sv_pump(q, now);
		break;
	default:
		q->state = next;
		break;
	}
	if (next == IBV_QPS_INIT)
		q->rq_open = 1;
	sv_check_overrun(q);
	ibqp->state = q->state;
	rc = 0;
out:
	pthread_mutex_unlock(&c->lk);
	if (rc)
		errno = rc;
	return rc;
}

SV_EXPORT int ibv_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask,
			   struct ibv_qp_init_attr *init_attr)
{
	(void)mask;
	if (!ibqp || !attr || !init_attr)
		return EINVAL;
	struct sv_qp *q = (struct sv_qp *)ibqp;
	pthread_mutex_lock(&q->ctx->lk);
	*attr = q->attr;
	attr->qp_state = q->state;
	attr->cur_qp_state = q->state;
	attr->cap = q->cap;
	attr->sq_draining = 0;
	memset(init_attr, 0, sizeof(*init_attr));
	init_attr->qp_context = ibqp->qp_context;
	init_attr->send_cq = ibqp->send_cq;
	init_attr->recv_cq = ibqp->recv_cq;
	init_attr->srq = ibqp->srq;
	init_attr->cap = q->cap;
	init_attr->qp_type = ibqp->qp_type;
	init_attr->sq_sig_all = q->sq_sig_all;
	pthread_mutex_unlock(&q->ctx->lk);
	return 0;
}

SV_EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	struct sv_qp *q = (struct sv_qp *)qp;
	return q && q->has_qpx ? &q->qpx : NULL;
}

/* ---- the ibv_wr_* API: WRs are built in the QP and posted by ibv_wr_complete through
 * ibv_post_send, with its checks; what it cannot build is EINVAL from ibv_wr_complete ---- */

static void sv_pw_clear(struct sv_qp *q)
{
	for (int i = 0; i < q->npw; i++) {
		free(q->pw[i].inl);
		q->pw[i].inl = NULL;
	}
	q->npw = 0;
	q->pw_err = 0;
}

static struct sv_pwr *sv_pw_new(struct ibv_qp_ex *x, enum ibv_wr_opcode op)
{
	struct sv_qp *q = (struct sv_qp *)x;
	if (q->npw == q->cappw) {
		int n = q->cappw ? q->cappw * 2 : 4;
		struct sv_pwr *p = realloc(q->pw, (size_t)n * sizeof(*p));
		if (!p) {
			q->pw_err = ENOMEM;
			return NULL;
		}
		q->pw = p;
		q->cappw = n;
	}
	struct sv_pwr *w = &q->pw[q->npw++];
	memset(&w->wr, 0, sizeof(w->wr));
	w->inl = NULL;
	w->wr.wr_id = x->wr_id;
	w->wr.send_flags = x->wr_flags;
	w->wr.opcode = op;
	return w;
}

static struct sv_pwr *sv_pw_last(struct ibv_qp_ex *x)
{
	struct sv_qp *q = (struct sv_qp *)x;
	if (!q->npw) {
		q->pw_err = EINVAL; /* a setter before any WR */
		return NULL;
	}
	return &q->pw[q->npw - 1];
}

static void sv_wr_send(struct ibv_qp_ex *x)
{
	sv_pw_new(x, IBV_WR_SEND);
}

static void sv_wr_send_imm(struct ibv_qp_ex *x, __be32 imm)
{
	struct sv_pwr *w = sv_pw_new(x, IBV_WR_SEND_WITH_IMM);
	if (w)
		w->wr.imm_data = imm;
}

static void sv_wr_rdma(struct ibv_qp_ex *x, enum ibv_wr_opcode op, uint32_t rkey, uint64_t addr, __be32 imm)
{
	struct sv_pwr *w = sv_pw_new(x, op);
	if (!w)
		return;
	w->wr.wr.rdma.rkey = rkey;
	w->wr.wr.rdma.remote_addr = addr;
	w->wr.imm_data = imm;
}

static void sv_wr_rdma_write(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr)
{
	sv_wr_rdma(x, IBV_WR_RDMA_WRITE, rkey, addr, 0);
}

static void sv_wr_rdma_write_imm(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr, __be32 imm)
{
	sv_wr_rdma(x, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, addr, imm);
}

static void sv_wr_rdma_read(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr)
{
	sv_wr_rdma(x, IBV_WR_RDMA_READ, rkey, addr, 0);
}

static void sv_wr_atomic(struct ibv_qp_ex *x, enum ibv_wr_opcode op, uint32_t rkey, uint64_t addr, uint64_t cmp_add,
			 uint64_t swap)
{
	struct sv_pwr *w = sv_pw_new(x, op);
	if (!w)
		return;
	w->wr.wr.atomic.rkey = rkey;
	w->wr.wr.atomic.remote_addr = addr;
	w->wr.wr.atomic.compare_add = cmp_add;
	w->wr.wr.atomic.swap = swap;
}

static void sv_wr_cmp_swp(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr, uint64_t compare, uint64_t swap)
{
	sv_wr_atomic(x, IBV_WR_ATOMIC_CMP_AND_SWP, rkey, addr, compare, swap);
}

static void sv_wr_fetch_add(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr, uint64_t add)
{
	sv_wr_atomic(x, IBV_WR_ATOMIC_FETCH_AND_ADD, rkey, addr, add, 0);
}

static void sv_wr_set_ud_addr(struct ibv_qp_ex *x, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey)
{
	struct sv_pwr *w = sv_pw_last(x);
	if (!w)
		return;
	w->wr.wr.ud.ah = ah;
	w->wr.wr.ud.remote_qpn = qpn;
	w->wr.wr.ud.remote_qkey = qkey;
}

static void sv_wr_set_sge_list(struct ibv_qp_ex *x, size_t n, const struct ibv_sge *sg)
{
	struct sv_pwr *w = sv_pw_last(x);
	if (!w)
		return;
	if (n > SV_MAX_SGE) {
		((struct sv_qp *)x)->pw_err = EINVAL;
		return;
	}
	if (n)
		memcpy(w->sge, sg, n * sizeof(*sg));
	w->wr.num_sge = (int)n;
}

static void sv_wr_set_sge(struct ibv_qp_ex *x, uint32_t lkey, uint64_t addr, uint32_t length)
{
	struct ibv_sge sg = {addr, length, lkey};
	sv_wr_set_sge_list(x, 1, &sg);
}

static void sv_wr_set_inline_data_list(struct ibv_qp_ex *x, size_t n, const struct ibv_data_buf *bufs)
{
	struct sv_pwr *w = sv_pw_last(x);
	if (!w)
		return;
	size_t total = 0;
	for (size_t i = 0; i < n; i++)
		total += bufs[i].length;
	free(w->inl);
	w->inl = malloc(total ? total : 1);
	if (!w->inl) {
		((struct sv_qp *)x)->pw_err = ENOMEM;
		return;
	}
	size_t off = 0;
	for (size_t i = 0; i < n; i++) {
		memcpy(w->inl + off, bufs[i].addr, bufs[i].length);
		off += bufs[i].length;
	}
	w->sge[0] = (struct ibv_sge){(uintptr_t)w->inl, (uint32_t)total, 0};
	w->wr.num_sge = 1;
	w->wr.send_flags |= IBV_SEND_INLINE;
}

static void sv_wr_set_inline_data(struct ibv_qp_ex *x, void *addr, size_t length)
{
	struct ibv_data_buf b = {addr, length};
	sv_wr_set_inline_data_list(x, 1, &b);
}

/* What softverbs does not offer: the WR list fails at ibv_wr_complete. */
static void sv_wr_refuse(struct ibv_qp_ex *x)
{
	((struct sv_qp *)x)->pw_err = EINVAL;
}

static void sv_wr_bind_mw(struct ibv_qp_ex *x, struct ibv_mw *mw, uint32_t rkey, const struct ibv_mw_bind_info *b)
{
	(void)mw, (void)rkey, (void)b;
	sv_wr_refuse(x);
}

static void sv_wr_rkey_op(struct ibv_qp_ex *x, uint32_t rkey)
{
	(void)rkey;
	sv_wr_refuse(x);
}

static void sv_wr_send_tso(struct ibv_qp_ex *x, void *hdr, uint16_t hdr_sz, uint16_t mss)
{
	(void)hdr, (void)hdr_sz, (void)mss;
	sv_wr_refuse(x);
}

static void sv_wr_atomic_write(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr, const void *v)
{
	(void)rkey, (void)addr, (void)v;
	sv_wr_refuse(x);
}

static void sv_wr_start(struct ibv_qp_ex *x)
{
	sv_pw_clear((struct sv_qp *)x);
}

static int sv_wr_complete(struct ibv_qp_ex *x)
{
	struct sv_qp *q = (struct sv_qp *)x;
	int rc = q->pw_err;
	if (!rc && q->npw) {
		for (int i = 0; i < q->npw; i++) {
			q->pw[i].wr.sg_list = q->pw[i].sge;
			q->pw[i].wr.next = i + 1 < q->npw ? &q->pw[i + 1].wr : NULL;
		}
		struct ibv_send_wr *bad;
		rc = sv_post_send(&q->qp, &q->pw[0].wr, &bad);
	}
	sv_pw_clear(q);
	return rc;
}

static void sv_wr_abort(struct ibv_qp_ex *x)
{
	sv_pw_clear((struct sv_qp *)x);
}

static const uint64_t sv_send_ops = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
				    IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
				    IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;

/* sv_create_qp_ex is ibv_create_qp_ex: a PD, send ops among sv_send_ops (the others, XRC,
 * create flags, TSO, RSS: EOPNOTSUPP). */
static struct ibv_qp *sv_create_qp_ex(struct ibv_context *context, struct ibv_qp_init_attr_ex *a)
{
	if (!context || !a || !(a->comp_mask & IBV_QP_INIT_ATTR_PD) || !a->pd || a->pd->context != context) {
		errno = EINVAL;
		return NULL;
	}
	if ((a->comp_mask & ~(uint32_t)(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS |
					IBV_QP_INIT_ATTR_CREATE_FLAGS)) ||
	    ((a->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && a->create_flags) ||
	    ((a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) && (a->send_ops_flags & ~sv_send_ops))) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	struct ibv_qp_init_attr ia = {.qp_context = a->qp_context, .send_cq = a->send_cq, .recv_cq = a->recv_cq,
				      .srq = a->srq, .cap = a->cap, .qp_type = a->qp_type,
				      .sq_sig_all = a->sq_sig_all};
	struct ibv_qp *qp = ibv_create_qp(a->pd, &ia);
	if (!qp)
		return NULL;
	a->cap = ia.cap;
	if (a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
		struct sv_qp *q = (struct sv_qp *)qp;
		struct ibv_qp_ex *x = &q->qpx;
		q->has_qpx = 1;
		x->wr_atomic_cmp_swp = sv_wr_cmp_swp;
		x->wr_atomic_fetch_add = sv_wr_fetch_add;
		x->wr_bind_mw = sv_wr_bind_mw;
		x->wr_local_inv = sv_wr_rkey_op;
		x->wr_rdma_read = sv_wr_rdma_read;
		x->wr_rdma_write = sv_wr_rdma_write;
		x->wr_rdma_write_imm = sv_wr_rdma_write_imm;
		x->wr_send = sv_wr_send;
		x->wr_send_imm = sv_wr_send_imm;
		x->wr_send_inv = sv_wr_rkey_op;
		x->wr_send_tso = sv_wr_send_tso;
		x->wr_set_ud_addr = sv_wr_set_ud_addr;
		x->wr_set_xrc_srqn = sv_wr_rkey_op;
		x->wr_set_inline_data = sv_wr_set_inline_data;
		x->wr_set_inline_data_list = sv_wr_set_inline_data_list;
		x->wr_set_sge = sv_wr_set_sge;
		x->wr_set_sge_list = sv_wr_set_sge_list;
		x->wr_start = sv_wr_start;
		x->wr_complete = sv_wr_complete;
		x->wr_abort = sv_wr_abort;
		x->wr_atomic_write = sv_wr_atomic_write;
	}
	return qp;
}

SV_EXPORT int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags)
{
	(void)qp, (void)op, (void)flags;
	return 0;
}

SV_EXPORT int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp, (void)ece;
	return EOPNOTSUPP;
}

SV_EXPORT int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp, (void)ece;
	return EOPNOTSUPP;
}

/* ---- what softverbs does not offer ---- */

/* ---- shared receive queues ---- */

SV_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *ibpd, struct ibv_srq_init_attr *attr)
{
	if (!ibpd || !attr || !attr->attr.max_wr || attr->attr.max_wr > SV_MAX_QP_WR ||
	    attr->attr.max_sge > SV_MAX_SGE) {
		errno = EINVAL;
		return NULL;
	}
	struct sv_ctx *c = sv_ctx(ibpd->context);
	if (sv_dead(c)) {
		errno = EIO;
		return NULL;
	}
	struct sv_srq *r = calloc(1, sizeof(*r));
	if (!r) {
		errno = ENOMEM;
		return NULL;
	}
	r->cap = sv_pow2(attr->attr.max_wr);
	r->max_sge = attr->attr.max_sge ? attr->attr.max_sge : 1;
	r->q = calloc(r->cap, sizeof(*r->q));
	r->sge = calloc((size_t)r->cap * r->max_sge, sizeof(*r->sge));
	if (!r->q || !r->sge) {
		free(r->q);
		free(r->sge);
		free(r);
		errno = ENOMEM;
		return NULL;
	}
	for (uint32_t i = 0; i < r->cap; i++)
		r->q[i].sge = r->sge + (size_t)i * r->max_sge;
	r->ctx = c;
	r->pd = (struct sv_pd *)ibpd;
	r->srq.context = ibpd->context;
	r->srq.srq_context = attr->srq_context;
	r->srq.pd = ibpd;
	r->srq.handle = 0;
	pthread_mutex_init(&r->srq.mutex, NULL);
	pthread_cond_init(&r->srq.cond, NULL);
	pthread_mutex_lock(&c->lk);
	r->pd->refs++;
	pthread_mutex_unlock(&c->lk);
	attr->attr.max_wr = r->cap;
	attr->attr.max_sge = r->max_sge;
	return &r->srq;
}

/* ibv_modify_srq arms the limit (IBV_SRQ_LIMIT); resizing (IBV_SRQ_MAX_WR) is not offered
 * (IBV_DEVICE_SRQ_RESIZE is not set), EINVAL as on such a device. */
SV_EXPORT int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask)
{
	if (!srq || !attr || (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)) || (mask & IBV_SRQ_MAX_WR))
		return EINVAL;
	struct sv_srq *r = (struct sv_srq *)srq;
	if (!(mask & IBV_SRQ_LIMIT))
		return 0;
	if (attr->srq_limit > r->cap)
		return EINVAL;
	pthread_mutex_lock(&r->ctx->lk);
	r->limit = attr->srq_limit;
	pthread_mutex_unlock(&r->ctx->lk);
	return 0;
}

SV_EXPORT int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr)
{
	if (!srq || !attr)
		return EINVAL;
	struct sv_srq *r = (struct sv_srq *)srq;
	pthread_mutex_lock(&r->ctx->lk);
	attr->max_wr = r->cap;
	attr->max_sge = r->max_sge;
	attr->srq_limit = r->limit;
	pthread_mutex_unlock(&r->ctx->lk);
	return 0;
}

SV_EXPORT int ibv_destroy_srq(struct ibv_srq *srq)
{
	if (!srq)
		return EINVAL;
	struct sv_srq *r = (struct sv_srq *)srq;
	struct sv_ctx *c = r->ctx;
	pthread_mutex_lock(&c->lk);
	if (r->nqp) {
		pthread_mutex_unlock(&c->lk);
		errno = EBUSY;
		return EBUSY;
	}
	sv_async_drop(c, r);
	r->pd->refs--;
	pthread_mutex_unlock(&c->lk);
	pthread_mutex_lock(&srq->mutex);
	while (srq->events_completed != __atomic_load_n(&r->ev_reported, __ATOMIC_SEQ_CST))
		pthread_cond_wait(&srq->cond, &srq->mutex);
	pthread_mutex_unlock(&srq->mutex);
	free(r->q);
	free(r->sge);
	free(r);
	return 0;
}

static int sv_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	if (!srq || !wr) {
		if (bad_wr)
			*bad_wr = wr;
		return EINVAL;
	}
	struct sv_srq *r = (struct sv_srq *)srq;
	int rc = 0;
	pthread_mutex_lock(&r->ctx->lk);
	for (; wr; wr = wr->next) {
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > r->max_sge || (wr->num_sge && !wr->sg_list)) {
			rc = EINVAL;
			break;
		}
		if (r->tail - r->head >= r->cap) {
			rc = ENOMEM;
			break;
		}
		struct sv_rwqe *w = &r->q[r->tail % r->cap];
		w->wr_id = wr->wr_id;
		w->nsge = wr->num_sge;
		if (wr->num_sge)
			memcpy(w->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(*w->sge));
		r->tail++;
	}
	pthread_mutex_unlock(&r->ctx->lk);
	if (rc) {
		if (bad_wr)
			*bad_wr = wr;
		errno = rc;
	}
	return rc;
}

/* ---- address handles ---- */

SV_EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	if (!pd || !attr) {
		errno = EINVAL;
		return NULL;
	}
	struct sv_ctx *c = sv_ctx(pd->context);
	if (sv_dead(c)) {
		errno = EIO;
		return NULL;
	}
	struct sockaddr_in dest;
	int rc = sv_resolve(c->dev, attr, 1, &dest); /* the QPN is each WR's */
	if (rc) {
		errno = rc;
		return NULL;
	}
	struct sv_ah *ah = calloc(1, sizeof(*ah));
	if (!ah) {
		errno = ENOMEM;
		return NULL;
	}
	ah->ah.context = pd->context;
	ah->ah.pd = pd;
	ah->dest = dest;
	ah->grh = attr->is_global;
	if (attr->is_global) {
		ah->dgid = attr->grh.dgid;
		struct sv_gid g;
		if (!sv_gid_at(c->dev, attr->grh.sgid_index, &g))
			ah->sgid = g.gid;
	}
	return &ah->ah;
}

SV_EXPORT int ibv_destroy_ah(struct ibv_ah *ah)
{
	if (!ah)
		return EINVAL;
	free(ah);
	return 0;
}

/* ibv_init_ah_from_wc gives the address vector back to the sender of a UD message: the GRH's
 * source GID as the DGID, the local GID entry that matches its destination GID as the SGID
 * (ENOENT when none does); without a GRH (InfiniBand mode), the WC's source LID. */
SV_EXPORT int ibv_init_ah_from_wc(struct ibv_context *context, uint8_t port_num, struct ibv_wc *wc,
				  struct ibv_grh *grh, struct ibv_ah_attr *ah_attr)
{
	if (!context || !wc || !ah_attr || port_num != 1) {
		errno = EINVAL;
		return -1;
	}
	memset(ah_attr, 0, sizeof(*ah_attr));
	ah_attr->dlid = wc->slid;
	ah_attr->sl = wc->sl;
	ah_attr->src_path_bits = wc->dlid_path_bits;
	ah_attr->port_num = port_num;
	if (!(wc->wc_flags & IBV_WC_GRH))
		return 0;
	if (!grh) {
		errno = EINVAL;
		return -1;
	}
	const struct sv_dev *d = sv_ctx(context)->dev;
	struct sv_gid g;
	int idx = -1;
	for (unsigned i = 0; i < SV_GID_TBL_LEN && idx < 0; i++)
		if (!sv_gid_at(d, i, &g) && !memcmp(g.gid.raw, grh->dgid.raw, 16))
			idx = (int)i;
	if (idx < 0) {
		errno = ENOENT;
		return -1;
	}
	ah_attr->is_global = 1;
	ah_attr->grh.dgid = grh->sgid;
	ah_attr->grh.sgid_index = (uint8_t)idx;
	ah_attr->grh.hop_limit = 0xff;
	ah_attr->grh.traffic_class = (uint8_t)((be32toh(grh->version_tclass_flow) >> 20) & 0xff);
	return 0;
}

SV_EXPORT struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc, struct ibv_grh *grh,
					       uint8_t port_num)
{
	struct ibv_ah_attr a;
	if (!pd) {
		errno = EINVAL;
		return NULL;
	}
	if (ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &a))
		return NULL;
	return ibv_create_ah(pd, &a);
}

SV_EXPORT int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	(void)qp, (void)gid, (void)lid;
	return EOPNOTSUPP;
}

SV_EXPORT int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	(void)qp, (void)gid, (void)lid;
	return EOPNOTSUPP;
}

/* ---- contexts ---- */

SV_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct sv_dev *d = sv_dev_of(device);
	if (!d) {
		errno = ENODEV;
		return NULL;
	}
	sv_ctl_reload();
	if (sv_dev_fatal(d)) {
		errno = EIO;
		return NULL;
	}
	struct sv_ctx *c = calloc(1, sizeof(*c));
	if (!c) {
		errno = ENOMEM;
		return NULL;
	}
	c->qps = calloc(SV_NQPN, sizeof(*c->qps));
	c->epfd = epoll_create1(EPOLL_CLOEXEC);
	c->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	int afd = eventfd(0, EFD_CLOEXEC);
	if (!c->qps || c->epfd < 0 || c->wakefd < 0 || afd < 0) {
		int e = errno ? errno : ENOMEM;
		if (c->epfd >= 0)
			close(c->epfd);
		if (c->wakefd >= 0)
			close(c->wakefd);
		if (afd >= 0)
			close(afd);
		free(c->qps);
		free(c);
		errno = e;
		return NULL;
	}
	struct epoll_event ev = {.events = EPOLLIN, .data.u32 = SV_WAKE_ID};
	epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->wakefd, &ev);
	pthread_mutex_init(&c->lk, NULL);
	c->next_key = 0x100 + (uint32_t)(sv_now_ns() & 0xff00);
	c->rnd = (unsigned)sv_now_ns();
	c->pid = (uint32_t)getpid();
	if (getrandom(&c->tok_next, sizeof(c->tok_next), 0) != sizeof(c->tok_next))
		c->tok_next = (uint64_t)sv_now_ns() * 0x9e3779b97f4a7c15ULL ^ (uint64_t)(uintptr_t)c;
	c->dev = d;
	pthread_mutex_lock(&sv_glock);
	int dead = d->faults.fatal;
	c->fatal_gen = d->fatal_gen;
	c->port_gen = d->port_gen;
	c->port_down = d->faults.port_down;
	pthread_mutex_unlock(&sv_glock);
	if (dead) {
		close(c->epfd);
		close(c->wakefd);
		close(afd);
		free(c->qps);
		free(c);
		errno = EIO;
		return NULL;
	}
	struct ibv_context *ctx = &c->vctx.context;
	ctx->device = device;
	/* A device's command fd, as programs dup and pass it (ibv_import_device): /dev/null
	 * stands for softverbs' (there is no kernel device); -1 if it cannot be opened. */
	ctx->cmd_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	ctx->async_fd = afd;
	ctx->num_comp_vectors = 1;
	pthread_mutex_init(&ctx->mutex, NULL);
	ctx->abi_compat = __VERBS_ABI_IS_EXTENDED;
	ctx->ops.poll_cq = sv_poll_cq;
	ctx->ops.req_notify_cq = sv_req_notify_cq;
	ctx->ops.post_send = sv_post_send;
	ctx->ops.post_recv = sv_post_recv;
	ctx->ops.post_srq_recv = sv_post_srq_recv;
	c->vctx.sz = sizeof(struct verbs_context);
	c->vctx.query_port = sv_query_port;
	c->vctx.query_device_ex = sv_query_device_ex;
	c->vctx.create_qp_ex = sv_create_qp_ex;
	if (pthread_create(&c->thr, NULL, sv_thread, c)) {
		close(c->epfd);
		close(c->wakefd);
		close(afd);
		free(c->qps);
		free(c);
		errno = EAGAIN;
		return NULL;
	}
	return ctx;
}

SV_EXPORT int ibv_close_device(struct ibv_context *context)
{
	if (!context)
		return EINVAL;
	struct sv_ctx *c = sv_ctx(context);
	pthread_mutex_lock(&c->lk);
	c->stop = 1;
	sv_evfd_set(c->wakefd);
	pthread_mutex_unlock(&c->lk);
	pthread_join(c->thr, NULL);
	/* Like libibverbs, objects still open are not reclaimed; their sockets are closed. */
	for (struct sv_qp *q = c->qlist; q; q = q->next) {
		close(q->fd);
		q->fd = -1;
	}
	close(c->epfd);
	close(c->wakefd);
	free(c->txb);
	free(c->rxs);
	close(context->async_fd);
	if (context->cmd_fd >= 0)
		close(context->cmd_fd);
	free(c->qps);
	free(c->aq);
	free(c);
	return 0;
}

/* Default versions of the calls that also have an IBVERBS_1.0 entry point (compat.c). */
SV_V11(ibv_ack_async_event);
SV_V11(ibv_ack_cq_events);
SV_V11(ibv_alloc_pd);
SV_V11(ibv_attach_mcast);
SV_V11(ibv_close_device);
SV_V11(ibv_create_ah);
SV_V11(ibv_create_cq);
SV_V11(ibv_create_qp);
SV_V11(ibv_create_srq);
SV_V11(ibv_dealloc_pd);
SV_V11(ibv_dereg_mr);
SV_V11(ibv_destroy_ah);
SV_V11(ibv_destroy_cq);
SV_V11(ibv_destroy_qp);
SV_V11(ibv_destroy_srq);
SV_V11(ibv_detach_mcast);
SV_V11(ibv_get_async_event);
SV_V11(ibv_get_cq_event);
SV_V11(ibv_modify_qp);
SV_V11(ibv_modify_srq);
SV_V11(ibv_open_device);
SV_V11(ibv_query_device);
SV_V11(ibv_query_gid);
SV_V11(ibv_query_pkey);
SV_V11(ibv_query_port);
SV_V11(ibv_query_qp);
SV_V11(ibv_query_srq);
SV_V11(ibv_reg_mr);
SV_V11(ibv_resize_cq);
