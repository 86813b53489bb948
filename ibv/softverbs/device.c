//go:build ignore

/* softverbs: configuration, the devices, their GID tables, faults and statistics, strings and
 * small helpers. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <endian.h>
#include "sv.h"

struct sv_config sv_cfg;
pthread_mutex_t sv_glock = PTHREAD_MUTEX_INITIALIZER;
struct sv_dev sv_devs[SV_MAX_DEVICES];
int sv_ndevs;
static struct sv_faults sv_env_faults;
static pthread_once_t sv_once = PTHREAD_ONCE_INIT;

const char *const sv_counter_names[SV_NCNT] = {
	[SV_CNT_TX_PACKETS] = "tx_packets",
	[SV_CNT_RX_PACKETS] = "rx_packets",
	[SV_CNT_TX_DROPPED] = "tx_dropped",
	[SV_CNT_RX_DROPPED] = "rx_dropped",
	[SV_CNT_RNR_NAK_SENT] = "rnr_nak_sent",
	[SV_CNT_RNR_NAK_RECV] = "rnr_nak_received",
	[SV_CNT_SEQ_NAK_SENT] = "seq_nak_sent",
	[SV_CNT_SEQ_NAK_RECV] = "seq_nak_received",
	[SV_CNT_DUPLICATE] = "duplicate_request",
	[SV_CNT_ACK_TIMEOUT] = "local_ack_timeout",
	[SV_CNT_RETRY_EXC] = "retry_exceeded",
	[SV_CNT_RNR_RETRY_EXC] = "rnr_retry_exceeded",
	[SV_CNT_SAMEHOST_TX] = "samehost_tx_packets",
	[SV_CNT_SAMEHOST_RX] = "samehost_rx_packets",
	[SV_CNT_SAMEHOST_REFUSED] = "samehost_refused",
};

int64_t sv_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static const struct {
	const char *name;
	int val;
} sv_errnos[] = {
	{"EINVAL", EINVAL}, {"EHOSTUNREACH", EHOSTUNREACH}, {"ETIMEDOUT", ETIMEDOUT},
	{"ENETUNREACH", ENETUNREACH}, {"ENODATA", ENODATA}, {"EIO", EIO}, {"EAGAIN", EAGAIN},
	{"ENOMEM", ENOMEM}, {"EPERM", EPERM}, {"ENODEV", ENODEV},
};

static int sv_parse_errno(const char *v)
{
	if (!v || !*v || !strcasecmp(v, "none") || !strcmp(v, "0"))
		return 0;
	for (size_t i = 0; i < sizeof(sv_errnos) / sizeof(sv_errnos[0]); i++)
		if (!strcasecmp(v, sv_errnos[i].name))
			return sv_errnos[i].val;
	if (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes"))
		return EINVAL;
	int n = atoi(v);
	return n > 0 ? n : EINVAL;
}

static int sv_truthy(const char *v)
{
	return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
		     !strcasecmp(v, "on"));
}

/* sv_fault_kv applies one key=value to f; unknown keys are ignored. */
static void sv_fault_kv(struct sv_faults *f, const char *k, const char *v)
{
	if (!strcmp(k, "port"))
		f->port_down = !strcasecmp(v, "down");
	else if (!strcmp(k, "fatal"))
		f->fatal = sv_truthy(v);
	else if (!strcmp(k, "rtr_delay_ms"))
		f->rtr_delay_ms = atoi(v) > 0 ? atoi(v) : 0;
	else if (!strcmp(k, "rtr_fail"))
		f->rtr_fail = sv_parse_errno(v);
	else if (!strcmp(k, "drop_pct"))
		f->drop_pct = atoi(v) < 0 ? 0 : atoi(v) > 100 ? 100 : atoi(v);
}

/* sv_name_at is the name of device i: SOFTVERBS_DEVICE (default softverbs0) for device 0; a
 * name ending in a number counts on from it (softverbs0, softverbs1; mlx5_4, mlx5_5), any
 * other gets the index appended (foo, foo1, foo2). */
static void sv_name_at(const char *base, int i, char *out, size_t n)
{
	size_t len = strlen(base), d = len;
	while (d > 0 && isdigit((unsigned char)base[d - 1]))
		d--;
	if (i == 0)
		snprintf(out, n, "%s", base);
	else if (d < len && len - d < 9)
		snprintf(out, n, "%.*s%ld", (int)d, base, atol(base + d) + i);
	else
		snprintf(out, n, "%s%d", base, i);
}

/* sv_ip_list reads SOFTVERBS_IPV4: a comma-separated list, one address per device; a device
 * without one (or with an invalid one) takes the previous device's address plus one, the
 * first 127.0.0.1. */
static void sv_ip_list(const char *v, int n)
{
	uint32_t prev = 0x7f000000; /* so that device 0 defaults to 127.0.0.1 */
	char buf[512];
	snprintf(buf, sizeof(buf), "%s", v ? v : "");
	char *save = NULL, *tok = strtok_r(buf, ",", &save);
	for (int i = 0; i < n; i++) {
		struct in_addr a;
		uint32_t h = prev + 1;
		if (tok) {
			while (isspace((unsigned char)*tok))
				tok++;
			if (inet_pton(AF_INET, tok, &a) == 1)
				h = ntohl(a.s_addr);
			tok = strtok_r(NULL, ",", &save);
		}
		a.s_addr = htonl(h);
		memcpy(sv_devs[i].ip, &a, 4);
		prev = h;
	}
}

static void sv_init(void)
{
	const char *v;

	int n = 1;
	if ((v = getenv("SOFTVERBS_DEVICES")) && atoi(v) > 0)
		n = atoi(v) < SV_MAX_DEVICES ? atoi(v) : SV_MAX_DEVICES - 1;
	int phantom = (v = getenv("SOFTVERBS_PHANTOM")) && sv_truthy(v);
	sv_ndevs = n + (phantom && n < SV_MAX_DEVICES);
	sv_cfg.ib = (v = getenv("SOFTVERBS_LINK")) && !strcasecmp(v, "ib");
	sv_cfg.roce_v1_only = (v = getenv("SOFTVERBS_ROCE")) && !strcasecmp(v, "v1");
	sv_cfg.roce_v2_only = (v = getenv("SOFTVERBS_ROCE")) && !strcasecmp(v, "v2");
	int lid = (v = getenv("SOFTVERBS_LID")) && atoi(v) > 0 && atoi(v) < 0xc000 ? atoi(v) : 1;
	sv_cfg.active_mtu = IBV_MTU_1024;
	if ((v = getenv("SOFTVERBS_MTU"))) {
		switch (atoi(v)) {
		case 256: sv_cfg.active_mtu = IBV_MTU_256; break;
		case 512: sv_cfg.active_mtu = IBV_MTU_512; break;
		case 1024: sv_cfg.active_mtu = IBV_MTU_1024; break;
		case 2048: sv_cfg.active_mtu = IBV_MTU_2048; break;
		case 4096: sv_cfg.active_mtu = IBV_MTU_4096; break;
		}
	}
	sv_cfg.min_ack_ns = 20 * 1000000LL;
	if ((v = getenv("SOFTVERBS_MIN_ACK_TIMEOUT_MS")) && atoi(v) >= 0)
		sv_cfg.min_ack_ns = atoi(v) * 1000000LL;
	sv_cfg.samehost = !(v = getenv("SOFTVERBS_SAMEHOST")) || sv_truthy(v);
	sv_cfg.poll_hold_ns = 1000 * 1000;
	if ((v = getenv("SOFTVERBS_POLL_HOLD_US")) && atoi(v) >= 0)
		sv_cfg.poll_hold_ns = atoi(v) * 1000LL;
	if ((v = getenv("SOFTVERBS_CTL")))
		snprintf(sv_cfg.ctl, sizeof(sv_cfg.ctl), "%s", v);

	if ((v = getenv("SOFTVERBS_PORT")))
		sv_fault_kv(&sv_env_faults, "port", v);
	if ((v = getenv("SOFTVERBS_FATAL")))
		sv_fault_kv(&sv_env_faults, "fatal", v);
	if ((v = getenv("SOFTVERBS_RTR_DELAY_MS")))
		sv_fault_kv(&sv_env_faults, "rtr_delay_ms", v);
	if ((v = getenv("SOFTVERBS_RTR_FAIL")))
		sv_fault_kv(&sv_env_faults, "rtr_fail", v);
	if ((v = getenv("SOFTVERBS_DROP_PCT")))
		sv_fault_kv(&sv_env_faults, "drop_pct", v);

	sv_ip_list(getenv("SOFTVERBS_IPV4"), sv_ndevs);
	const char *base = (v = getenv("SOFTVERBS_DEVICE")) && *v ? v : "softverbs0";
	for (int i = 0; i < sv_ndevs; i++) {
		struct sv_dev *d = &sv_devs[i];
		d->index = i;
		d->phantom = phantom && i == sv_ndevs - 1;
		d->lid = lid + i < 0xc000 ? (uint16_t)(lid + i) : (uint16_t)lid;
		/* EUI-64 of the made-up MAC 02:00:a:b:c:d, without the U/L flip: the node GUID. */
		uint8_t g[8] = {0x02, 0x00, d->ip[0], 0xff, 0xfe, d->ip[1], d->ip[2], d->ip[3]};
		for (int k = 0; k < 8; k++)
			d->guid = d->guid << 8 | g[k];
		d->faults = sv_env_faults;
		if (d->phantom)
			d->faults.port_down = 1;
		d->fatal_gen = d->faults.fatal;
		char name[IBV_SYSFS_NAME_MAX];
		sv_name_at(base, i, name, sizeof(name));
		d->dev.node_type = IBV_NODE_CA;
		d->dev.transport_type = IBV_TRANSPORT_IB;
		snprintf(d->dev.name, sizeof(d->dev.name), "%s", name);
		snprintf(d->dev.dev_name, sizeof(d->dev.dev_name), "uverbs_%.48s", name);
		snprintf(d->dev.dev_path, sizeof(d->dev.dev_path), "/sys/class/infiniband_verbs/uverbs_%.48s",
			 name);
		snprintf(d->dev.ibdev_path, sizeof(d->dev.ibdev_path), "/sys/class/infiniband/%.48s", name);
	}
	sv_ctl_reload();
}

void sv_global_init(void)
{
	pthread_once(&sv_once, sv_init);
}

struct sv_dev *sv_dev_of(const struct ibv_device *d)
{
	sv_global_init();
	if (!d)
		return NULL;
	for (int i = 0; i < sv_ndevs; i++)
		if (d == &sv_devs[i].dev)
			return &sv_devs[i];
	return NULL;
}

int sv_dev_port_down(const struct sv_dev *d)
{
	return __atomic_load_n(&d->faults.port_down, __ATOMIC_ACQUIRE);
}

int sv_dev_fatal(const struct sv_dev *d)
{
	return __atomic_load_n(&d->faults.fatal, __ATOMIC_ACQUIRE);
}

/* sv_dev_set installs faults f on d (sv_glock held): a rise of fatal starts a new generation
 * (every context opened before is dead for good, whatever follows), a port state change
 * another. The phantom's port stays DOWN. */
static void sv_dev_set(struct sv_dev *d, struct sv_faults f)
{
	if (d->phantom)
		f.port_down = 1;
	if (f.fatal && !d->faults.fatal)
		__atomic_add_fetch(&d->fatal_gen, 1, __ATOMIC_RELEASE);
	if (f.port_down != d->faults.port_down)
		__atomic_add_fetch(&d->port_gen, 1, __ATOMIC_RELEASE);
	__atomic_store_n(&d->faults.port_down, f.port_down, __ATOMIC_RELEASE);
	__atomic_store_n(&d->faults.fatal, f.fatal, __ATOMIC_RELEASE);
	__atomic_store_n(&d->faults.rtr_delay_ms, f.rtr_delay_ms, __ATOMIC_RELEASE);
	__atomic_store_n(&d->faults.rtr_fail, f.rtr_fail, __ATOMIC_RELEASE);
	__atomic_store_n(&d->faults.drop_pct, f.drop_pct, __ATOMIC_RELEASE);
}

static char *sv_trim(char *p)
{
	while (isspace((unsigned char)*p))
		p++;
	for (char *e = p + strlen(p); e > p && isspace((unsigned char)e[-1]); e--)
		e[-1] = 0;
	return p;
}

/* sv_ctl_reload re-reads the control file when its contents changed: each device's faults
 * become the environment's with the file's lines applied on top, in order: `key=value` lines
 * apply to every device, `<device>.key=value` lines to the device of that name. */
void sv_ctl_reload(void)
{
	static char last[4096];
	static int have_last;
	char buf[4096];

	if (!sv_cfg.ctl[0])
		return;
	int fd = open(sv_cfg.ctl, O_RDONLY | O_CLOEXEC);
	ssize_t n = 0;
	if (fd >= 0) {
		n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
	}
	if (n < 0)
		n = 0;
	buf[n] = 0;
	pthread_mutex_lock(&sv_glock);
	if (have_last && !strcmp(last, buf)) {
		pthread_mutex_unlock(&sv_glock);
		return;
	}
	memcpy(last, buf, (size_t)n + 1);
	have_last = 1;
	struct sv_faults f[SV_MAX_DEVICES];
	for (int i = 0; i < sv_ndevs; i++)
		f[i] = sv_env_faults;
	char *save = NULL;
	for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *eq = strchr(line, '=');
		if (!eq)
			continue;
		*eq = 0;
		char *k = sv_trim(line), *v = sv_trim(eq + 1);
		char *dot = strrchr(k, '.');
		for (int i = 0; i < sv_ndevs; i++) {
			if (!dot)
				sv_fault_kv(&f[i], k, v);
			else if ((size_t)(dot - k) == strlen(sv_devs[i].dev.name) &&
				 !strncmp(k, sv_devs[i].dev.name, (size_t)(dot - k)))
				sv_fault_kv(&f[i], dot + 1, v);
		}
	}
	for (int i = 0; i < sv_ndevs; i++)
		sv_dev_set(&sv_devs[i], f[i]);
	pthread_mutex_unlock(&sv_glock);
}

void sv_faults_snapshot(const struct sv_dev *d, struct sv_faults *f)
{
	pthread_mutex_lock(&sv_glock);
	*f = d->faults;
	pthread_mutex_unlock(&sv_glock);
}

/* The GID table. Ethernet (RoCE, as mlx5 lists an IPv4 netdev): 0 RoCE v1 fe80::, 1 RoCE v2
 * fe80::, 2 RoCE v1 ::ffff:a.b.c.d, 3 RoCE v2 ::ffff:a.b.c.d, the rest empty. InfiniBand: 0
 * fe80::GUID, the rest empty. */
int sv_gid_at(const struct sv_dev *d, unsigned index, struct sv_gid *out)
{
	memset(out, 0, sizeof(*out));
	if (index >= SV_GID_TBL_LEN)
		return EINVAL;
	uint8_t *g = out->gid.raw;
	const uint8_t *ip = d->ip;
	uint8_t eui[8] = {0x00, 0x00, ip[0], 0xff, 0xfe, ip[1], ip[2], ip[3]};
	if (sv_cfg.ib) {
		if (index != 0)
			return ENODATA;
		g[0] = 0xfe;
		g[1] = 0x80;
		eui[0] = 0x02;
		memcpy(g + 8, eui, 8);
		out->type = IBV_GID_TYPE_IB;
		out->valid = 1;
		return 0;
	}
	if (sv_cfg.roce_v1_only && (index & 1))
		return ENODATA;
	if (sv_cfg.roce_v2_only) {
		/* one RoCE v2 entry per address, as NICs that list no v1 entries */
		if (index > 1)
			return ENODATA;
		index = index * 2 + 1;
	}
	switch (index) {
	case 0:
	case 1:
		g[0] = 0xfe;
		g[1] = 0x80;
		memcpy(g + 8, eui, 8);
		break;
	case 2:
	case 3:
		g[10] = g[11] = 0xff;
		memcpy(g + 12, ip, 4);
		break;
	default:
		return ENODATA;
	}
	out->type = index & 1 ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1;
	out->valid = 1;
	return 0;
}

int sv_gid_is_v4mapped(const union ibv_gid *g)
{
	static const uint8_t pfx[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	return !memcmp(g->raw, pfx, 12);
}

int sv_gid_ipv4(const union ibv_gid *g, uint8_t ip[4])
{
	const uint8_t *b = g->raw;
	if (sv_gid_is_v4mapped(g)) {
		memcpy(ip, b + 12, 4);
		return 0;
	}
	/* fe80::/64 with a softverbs interface ID (x x a ff fe b c d). */
	if (b[0] == 0xfe && b[1] == 0x80 && !b[2] && !b[3] && !b[4] && !b[5] && !b[6] && !b[7] &&
	    b[11] == 0xff && b[12] == 0xfe) {
		ip[0] = b[10];
		ip[1] = b[13];
		ip[2] = b[14];
		ip[3] = b[15];
		return 0;
	}
	return -1;
}

/* ---- exported helpers that need no context ---- */

SV_EXPORT struct ibv_device **ibv_get_device_list(int *num_devices)
{
	sv_global_init();
	struct ibv_device **l = calloc((size_t)sv_ndevs + 1, sizeof(*l));
	if (!l) {
		errno = ENOMEM;
		return NULL;
	}
	for (int i = 0; i < sv_ndevs; i++)
		l[i] = &sv_devs[i].dev;
	if (num_devices)
		*num_devices = sv_ndevs;
	return l;
}

SV_EXPORT void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

SV_EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
	if (!device) {
		errno = EINVAL;
		return NULL;
	}
	return device->name;
}

SV_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device)
{
	struct sv_dev *d = sv_dev_of(device);
	return d ? htobe64(d->guid) : 0;
}

SV_EXPORT int ibv_get_device_index(struct ibv_device *device)
{
	struct sv_dev *d = sv_dev_of(device);
	return d ? d->index : -1;
}

SV_EXPORT const char *ibv_get_sysfs_path(void)
{
	return "/sys";
}

/* sv_sysfs_attr answers rel, a path below a device's made-up sysfs directory, as the kernel's
 * files read: the device's attributes, its port's state and its statistics (hw_counters).
 * NULL: no such file. */
static const char *sv_sysfs_attr(struct sv_dev *d, const char *rel, int ibdev, char *tmp, size_t n)
{
	if (!strcmp(rel, "board_id"))
		return "SOFTVERBS_0001";
	if (!strcmp(rel, "fw_ver"))
		return "1.0.0";
	if (!strcmp(rel, "node_type"))
		return "1: CA";
	if (!strcmp(rel, "ibdev"))
		return d->dev.name;
	if (!ibdev)
		return NULL;
	if (!strcmp(rel, "node_guid") || !strcmp(rel, "sys_image_guid")) {
		snprintf(tmp, n, "%04x:%04x:%04x:%04x", (unsigned)(d->guid >> 48) & 0xffff,
			 (unsigned)(d->guid >> 32) & 0xffff, (unsigned)(d->guid >> 16) & 0xffff,
			 (unsigned)d->guid & 0xffff);
		return tmp;
	}
	if (strncmp(rel, "ports/1/", 8))
		return NULL;
	rel += 8;
	int down = sv_dev_port_down(d) || sv_dev_fatal(d);
	if (!strcmp(rel, "state"))
		return down ? "1: DOWN" : "4: ACTIVE";
	if (!strcmp(rel, "phys_state"))
		return !down ? "5: LinkUp" : d->phantom ? "2: Polling" : "3: Disabled";
	if (!strcmp(rel, "link_layer"))
		return sv_cfg.ib ? "InfiniBand" : "Ethernet";
	if (!strcmp(rel, "lid")) {
		snprintf(tmp, n, "0x%x", sv_cfg.ib ? d->lid : 0);
		return tmp;
	}
	if (!strncmp(rel, "hw_counters/", 12)) {
		for (int i = 0; i < SV_NCNT; i++)
			if (!strcmp(rel + 12, sv_counter_names[i])) {
				snprintf(tmp, n, "%llu",
					 (unsigned long long)__atomic_load_n(&d->cnt[i], __ATOMIC_RELAXED));
				return tmp;
			}
	}
	return NULL;
}

/* ibv_read_sysfs_file answers the files below a softverbs device's made-up paths
 * (/sys/class/infiniband/<name>, /sys/class/infiniband_verbs/uverbs_<name>), and reads real
 * sysfs files otherwise. */
SV_EXPORT int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
	if (!dir || !file || !buf || !size) {
		errno = EINVAL;
		return -1;
	}
	char path[512], tmp[64];
	snprintf(path, sizeof(path), "%s/%s", dir, file);
	sv_global_init();
	for (int i = 0; i < sv_ndevs; i++) {
		struct sv_dev *d = &sv_devs[i];
		for (int ib = 0; ib < 2; ib++) {
			const char *base = ib ? d->dev.ibdev_path : d->dev.dev_path;
			size_t bl = strlen(base);
			if (strncmp(path, base, bl) || path[bl] != '/')
				continue;
			const char *rel = path + bl;
			while (*rel == '/')
				rel++;
			const char *v = sv_sysfs_attr(d, rel, ib, tmp, sizeof(tmp));
			if (!v) {
				errno = ENOENT;
				return -1;
			}
			snprintf(buf, size, "%s", v);
			return (int)strlen(buf);
		}
	}
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, size);
	close(fd);
	if (n < 0)
		return -1;
	if (n > 0 && buf[n - 1] == '\n')
		buf[--n] = 0;
	else if ((size_t)n < size)
		buf[n] = 0;
	return (int)n;
}

SV_EXPORT int ibv_fork_init(void)
{
	return 0;
}

SV_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void)
{
	return IBV_FORK_UNNEEDED;
}

SV_EXPORT int ibv_dontfork_range(void *base, size_t size)
{
	(void)base;
	(void)size;
	return 0;
}

SV_EXPORT int ibv_dofork_range(void *base, size_t size)
{
	(void)base;
	(void)size;
	return 0;
}

SV_EXPORT const char *ibv_node_type_str(enum ibv_node_type t)
{
	static const char *const s[] = {"InfiniBand channel adapter", "InfiniBand switch",
					"InfiniBand router", "iWARP NIC", "usNIC", "usNIC UDP",
					"unspecified"};
	if (t < IBV_NODE_CA || t > IBV_NODE_UNSPECIFIED)
		return "unknown";
	return s[t - IBV_NODE_CA];
}

SV_EXPORT const char *ibv_port_state_str(enum ibv_port_state s)
{
	static const char *const n[] = {"PORT_NOP", "PORT_DOWN", "PORT_INIT", "PORT_ARMED",
					"PORT_ACTIVE", "PORT_ACTIVE_DEFER"};
	if ((unsigned)s > IBV_PORT_ACTIVE_DEFER)
		return "unknown";
	return n[s];
}

SV_EXPORT const char *ibv_event_type_str(enum ibv_event_type e)
{
	static const char *const n[] = {
		"CQ error", "local work queue catastrophic error", "invalid request local work queue error",
		"local access violation work queue error", "communication established", "send queue drained",
		"path migrated", "path migration request error", "local catastrophic error", "port active",
		"port error", "LID change", "P_Key change", "SM change", "SRQ catastrophic error",
		"SRQ limit reached", "last WQE reached", "client reregistration", "GID table change",
		"WQ fatal"};
	if ((unsigned)e >= sizeof(n) / sizeof(n[0]))
		return "unknown";
	return n[e];
}

SV_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status s)
{
	static const char *const n[] = {
		"success", "local length error", "local QP operation error", "local EE context operation error",
		"local protection error", "Work Request Flushed Error", "memory management operation error",
		"bad response error", "local access error", "remote invalid request error", "remote access error",
		"remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
		"local RDD violation error", "remote invalid RD request", "aborted error",
		"invalid EE context number", "invalid EE context state", "fatal error", "response timeout error",
		"general error", "TM error", "TM rendezvous incomplete"};
	if ((unsigned)s >= sizeof(n) / sizeof(n[0]))
		return "unknown";
	return n[s];
}

static const struct {
	enum ibv_rate rate;
	int mult;
	int mbps;
} sv_rates[] = {
	{IBV_RATE_2_5_GBPS, 1, 2500}, {IBV_RATE_5_GBPS, 2, 5000}, {IBV_RATE_10_GBPS, 4, 10000},
	{IBV_RATE_20_GBPS, 8, 20000}, {IBV_RATE_30_GBPS, 12, 30000}, {IBV_RATE_40_GBPS, 16, 40000},
	{IBV_RATE_60_GBPS, 24, 60000}, {IBV_RATE_80_GBPS, 32, 80000}, {IBV_RATE_120_GBPS, 48, 120000},
	{IBV_RATE_14_GBPS, 0, 14062}, {IBV_RATE_56_GBPS, 0, 56250}, {IBV_RATE_112_GBPS, 0, 112500},
	{IBV_RATE_168_GBPS, 0, 168750}, {IBV_RATE_25_GBPS, 10, 25781}, {IBV_RATE_100_GBPS, 40, 103125},
	{IBV_RATE_200_GBPS, 80, 206250}, {IBV_RATE_300_GBPS, 120, 309375},
	{IBV_RATE_28_GBPS, 11, 28125}, {IBV_RATE_50_GBPS, 20, 53125},
	{IBV_RATE_400_GBPS, 160, 425000}, {IBV_RATE_600_GBPS, 240, 637500},
};
#define SV_NRATES (sizeof(sv_rates) / sizeof(sv_rates[0]))

SV_EXPORT int ibv_rate_to_mult(enum ibv_rate rate)
{
	for (size_t i = 0; i < SV_NRATES; i++)
		if (sv_rates[i].rate == rate)
			return sv_rates[i].mult ? sv_rates[i].mult : -1;
	return -1;
}

SV_EXPORT enum ibv_rate mult_to_ibv_rate(int mult)
{
	for (size_t i = 0; i < SV_NRATES; i++)
		if (sv_rates[i].mult && sv_rates[i].mult == mult)
			return sv_rates[i].rate;
	return IBV_RATE_MAX;
}

SV_EXPORT int ibv_rate_to_mbps(enum ibv_rate rate)
{
	for (size_t i = 0; i < SV_NRATES; i++)
		if (sv_rates[i].rate == rate)
			return sv_rates[i].mbps;
	return -1;
}

SV_EXPORT enum ibv_rate mbps_to_ibv_rate(int mbps)
{
	for (size_t i = 0; i < SV_NRATES; i++)
		if (sv_rates[i].mbps == mbps)
			return sv_rates[i].rate;
	return IBV_RATE_MAX;
}

/* Default versions of the calls that also have an IBVERBS_1.0 entry point (compat.c). */
SV_V11(ibv_free_device_list);
SV_V11(ibv_get_device_guid);
SV_V11(ibv_get_device_list);
SV_V11(ibv_get_device_name);
