// Threads take turns on one monitor: each holds it for a while inside
// holdLock, so the others block entering it (HotSpot parks them in
// ObjectMonitor::enter on a futex under pthread_cond_wait).
public class Contend {
    static final Object lock = new Object();
    static volatile long sink;

    static void holdLock() {
        synchronized (lock) {
            long x = 0;
            for (int i = 0; i < 3_000_000; i++) {
                x += (long) i * 31 ^ (x >>> 3);
            }
            sink = x;
        }
    }

    public static void main(String[] args) throws Exception {
        long end = System.nanoTime() + Long.parseLong(args[0]) * 1_000_000L;
        Thread[] ts = new Thread[4];
        for (int i = 0; i < ts.length; i++) {
            ts[i] = new Thread(() -> {
                while (System.nanoTime() < end) {
                    holdLock();
                }
            }, "contender-" + i);
            ts[i].start();
        }
        System.out.println("started");
        for (Thread t : ts) {
            t.join();
        }
    }
}
