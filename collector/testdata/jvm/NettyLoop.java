import io.netty.channel.EventLoop;
import io.netty.channel.nio.NioEventLoopGroup;

// A Netty NIO event loop that sleeps in epoll_wait between tasks, and a
// thread that hands it a task every few milliseconds: each hand-off wakes
// the loop through its selector.
public class NettyLoop {
    static volatile long sink;

    public static void main(String[] args) throws Exception {
        long end = System.nanoTime() + Long.parseLong(args[0]) * 1_000_000L;
        NioEventLoopGroup group = new NioEventLoopGroup(1);
        EventLoop loop = group.next();
        Thread feeder = new Thread(() -> {
            while (System.nanoTime() < end) {
                loop.execute(() -> sink++);
                try {
                    Thread.sleep(3);
                } catch (InterruptedException e) {
                    return;
                }
            }
        }, "feeder");
        feeder.start();
        System.out.println("started");
        feeder.join();
        group.shutdownGracefully(0, 0, java.util.concurrent.TimeUnit.MILLISECONDS).sync();
    }
}
