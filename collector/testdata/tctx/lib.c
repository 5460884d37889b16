/* otel_thread_ctx_v1 in a library the server dlopens: dynamic TLS, reached
 * through a TLS descriptor (build with -mtls-dialect=gnu2). */
#include <stdatomic.h>

#include "record.h"

__attribute__((visibility("default"))) __thread struct tctx_record *otel_thread_ctx_v1;

__attribute__((visibility("default"))) void tctx_publish(struct tctx_record *r)
{
	atomic_signal_fence(memory_order_seq_cst);
	otel_thread_ctx_v1 = r;
	atomic_signal_fence(memory_order_seq_cst);
}
