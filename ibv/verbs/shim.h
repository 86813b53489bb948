//go:build rdma

// C side of the verbs provider: thin wrappers over libibverbs' inline functions and macros
// (cgo cannot call those), and flat structs that Go reads and writes without touching C
// unions. Object contexts (cq_context, qp_context) carry integer handles, never Go pointers.

#ifndef TWOSIDED_VERBS_SHIM_H
#define TWOSIDED_VERBS_SHIM_H

#include <stdint.h>
#include <stddef.h>
#include <infiniband/verbs.h>

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

int tsv_set_nonblock(int fd);
struct ibv_mr *tsv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access);
int tsv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *out);
ssize_t tsv_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries, size_t max);
struct ibv_cq *tsv_create_cq(struct ibv_context *ctx, int cqe, uintptr_t handle,
			     struct ibv_comp_channel *ch, int comp_vector);
int tsv_num_comp_vectors(struct ibv_context *ctx);
int tsv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, uintptr_t *handle);
int tsv_req_notify(struct ibv_cq *cq, int solicited_only);
int tsv_poll(struct ibv_cq *cq, int n, struct ibv_wc *raw, struct tsv_wc *out);
struct ibv_qp *tsv_create_qp(struct ibv_pd *pd, struct ibv_cq *send_cq, struct ibv_cq *recv_cq,
			     struct ibv_qp_cap *cap, int qp_type, int sq_sig_all, uintptr_t handle);
int tsv_post_send(struct ibv_qp *qp, const struct tsv_send *in, int n,
		  struct ibv_sge *sges, struct ibv_send_wr *scratch, int *bad);
int tsv_post_recv(struct ibv_qp *qp, const struct tsv_recv *in, int n,
		  struct ibv_sge *sges, struct ibv_recv_wr *scratch, int *bad);
int tsv_get_async(struct ibv_context *ctx, struct ibv_async_event *raw, struct tsv_async *out);
void tsv_ack_async_raw(struct ibv_async_event *raw);
void tsv_ack_async_cq(struct ibv_cq *cq, int type);
void tsv_ack_async_qp(struct ibv_qp *qp, int type);
uint64_t tsv_node_guid(struct ibv_device *dev);

#endif
