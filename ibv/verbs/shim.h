//go:build rdma

// C side of the verbs provider: libibverbs loaded at run time (tsv_load: dlopen, then one
// dlvsym per entry point into a table of function pointers), a wrapper per entry point that
// calls through that table, thin wrappers over libibverbs' inline functions and macros (cgo
// cannot call those), and flat structs that Go reads and writes without touching C unions.
// Object contexts (cq_context, qp_context) carry integer handles, never Go pointers.
//
// Nothing here or in the Go files may name a libibverbs function directly: that would make
// the binary need libibverbs.so.1 at link time and at start. The names below are poisoned
// after <infiniband/verbs.h> so that such a call fails to compile; the inline verbs that go
// through context->ops (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq) name
// no symbol and stay usable. TestNoLinkTimeLibibverbs checks the built binary.

#ifndef TWOSIDED_VERBS_SHIM_H
#define TWOSIDED_VERBS_SHIM_H

#include <stdint.h>
#include <stddef.h>
#include <infiniband/verbs.h>

// Exported libibverbs functions: call tsv_<name> instead (after tsv_load succeeded). The
// function-like macros of the same names are dropped first (poisoning a macro warns).
#undef ibv_get_device_list
#undef ibv_reg_mr
#undef ibv_query_port
#pragma GCC poison ibv_get_device_list ibv_free_device_list ibv_get_device_name
#pragma GCC poison ibv_get_device_guid ibv_open_device ibv_close_device ibv_fork_init
#pragma GCC poison ibv_query_device ibv_query_port ibv_query_gid ibv_query_gid_table
#pragma GCC poison _ibv_query_gid_table ibv_alloc_pd ibv_dealloc_pd ibv_reg_mr
#pragma GCC poison ibv_reg_mr_iova2 ibv_dereg_mr ibv_create_comp_channel
#pragma GCC poison ibv_destroy_comp_channel ibv_create_cq ibv_destroy_cq ibv_get_cq_event
#pragma GCC poison ibv_ack_cq_events ibv_create_qp ibv_query_qp ibv_modify_qp
#pragma GCC poison ibv_destroy_qp ibv_get_async_event ibv_ack_async_event

// tsv_wc is struct ibv_wc flattened; imm_data is in host order.
struct tsv_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t vendor_err;
	uint32_t byte_len;
	uint32_t imm_data;
	uint32_t qp_num;
	uint32_t src_qp;
	uint32_t wc_flags;
};

// tsv_send is one send WR; its num_sge SGEs follow the previous WR's in the SGE array.
struct tsv_send {
	uint64_t wr_id;
	uint32_t opcode;
	uint32_t send_flags;
	uint32_t imm_data; // host order
	uint32_t num_sge;
};

// tsv_recv is one receive WR, laid out like tsv_send.
struct tsv_recv {
	uint64_t wr_id;
	uint32_t num_sge;
};

// tsv_async is struct ibv_async_event with its element resolved.
struct tsv_async {
	uint32_t type;
	uint32_t kind;    // TSV_ELEM_*
	uint32_t port;
	uintptr_t handle; // cq_context or qp_context
};

enum {
	TSV_ELEM_NONE = 0,
	TSV_ELEM_CQ = 1,
	TSV_ELEM_QP = 2,
	TSV_ELEM_PORT = 3,
};

// tsv_load opens the library at path with dlopen(RTLD_NOW | RTLD_LOCAL) and resolves every
// entry point with dlvsym at the symbol version rdma-core exports it under. It returns 0
// and writes the file the library was loaded from to where; -1 when dlopen failed; 1 + i
// when entry point i (tsv_sym_name, tsv_sym_version) is missing. err receives dlerror's
// text. With install 0 it only tries (a probe: the library is closed again and the table
// is left as it was); with install 1 it fills the table on success and never closes the
// library. Not safe to call concurrently with itself (the Go side runs it under a sync.Once).
int tsv_load(const char *path, int install, char *err, size_t errlen, char *where, size_t wherelen);
const char *tsv_sym_name(int i);
const char *tsv_sym_version(int i);
// tsv_nsyms is the number of entry points; tsv_sym_optional says whether entry point i may
// be missing.
int tsv_nsyms(void);
int tsv_sym_optional(int i);

// Entry points of libibverbs, through the table (valid only after tsv_load installed it).
struct ibv_device **tsv_get_device_list(int *num);
void tsv_free_device_list(struct ibv_device **list);
const char *tsv_get_device_name(struct ibv_device *dev);
struct ibv_context *tsv_open_device(struct ibv_device *dev);
int tsv_close_device(struct ibv_context *ctx);
int tsv_fork_init(void);
int tsv_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr);
int tsv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
struct ibv_pd *tsv_alloc_pd(struct ibv_context *ctx);
int tsv_dealloc_pd(struct ibv_pd *pd);
int tsv_dereg_mr(struct ibv_mr *mr);
struct ibv_comp_channel *tsv_create_comp_channel(struct ibv_context *ctx);
int tsv_destroy_comp_channel(struct ibv_comp_channel *ch);
int tsv_destroy_cq(struct ibv_cq *cq);
int tsv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask, struct ibv_qp_init_attr *init);
int tsv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
int tsv_destroy_qp(struct ibv_qp *qp);

int tsv_set_nonblock(int fd);
struct ibv_mr *tsv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access);
int tsv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *out);
ssize_t tsv_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries, size_t max);
struct ibv_cq *tsv_create_cq(struct ibv_context *ctx, int cqe, uintptr_t handle,
			     struct ibv_comp_channel *ch, int comp_vector);
int tsv_num_comp_vectors(struct ibv_context *ctx);
// The calls of a notify's path take the addresses of libibverbs' objects (and of the C
// scratch they write) as uintptr_t: cgo checks every argument of a pointer type that may
// point to a pointer for Go memory at each call (about 2 % of the CPU of a softverbs echo),
// and these never point to Go memory.
struct tsv_cq_event {
	struct ibv_cq *cq;
	uintptr_t handle;
};
int tsv_get_cq_event(uintptr_t ch, uintptr_t ev);
void tsv_ack_cq_events(uintptr_t cq, unsigned int n);
int tsv_req_notify(uintptr_t cq, int solicited_only);
int tsv_poll(uintptr_t cq, int n, struct ibv_wc *raw, struct tsv_wc *out);
struct ibv_qp *tsv_create_qp(struct ibv_pd *pd, struct ibv_cq *send_cq, struct ibv_cq *recv_cq,
			     struct ibv_qp_cap *cap, int qp_type, int sq_sig_all, uintptr_t handle);
int tsv_post_send(uintptr_t qp, const struct tsv_send *in, int n,
		  struct ibv_sge *sges, uintptr_t scratch, int *bad);
int tsv_post_recv(uintptr_t qp, const struct tsv_recv *in, int n,
		  struct ibv_sge *sges, uintptr_t scratch, int *bad);
int tsv_get_async(struct ibv_context *ctx, struct ibv_async_event *raw, struct tsv_async *out);
void tsv_ack_async_raw(struct ibv_async_event *raw);
void tsv_ack_async_cq(struct ibv_cq *cq, int type);
void tsv_ack_async_qp(struct ibv_qp *qp, int type);
uint64_t tsv_node_guid(struct ibv_device *dev);

#endif
