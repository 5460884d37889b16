import java.util.concurrent.*;
import java.util.concurrent.locks.*;

// Four threads contend on a ReentrantLock held for short bursts; a pool of
// four workers mostly waits for tasks; a scheduler ticks every 5 ms.
public class Juc {
    static final ReentrantLock lock = new ReentrantLock();
    static long counter;

    static void holdLock() {
        lock.lock();
        try {
            long end = System.nanoTime() + 200_000;
            while (System.nanoTime() < end) counter++;
        } finally {
            lock.unlock();
        }
    }

    public static void main(String[] args) throws Exception {
        long ms = Long.parseLong(args[0]);
        for (int i = 0; i < 4; i++) {
            Thread t = new Thread(() -> { while (true) holdLock(); }, "locker-" + i);
            t.setDaemon(true);
            t.start();
        }
        ExecutorService pool = Executors.newFixedThreadPool(4);
        ScheduledExecutorService timer = Executors.newSingleThreadScheduledExecutor();
        timer.scheduleAtFixedRate(() -> pool.submit(() -> counter++), 5, 5, TimeUnit.MILLISECONDS);
        Thread.sleep(ms);
        System.exit(0);
    }
}
