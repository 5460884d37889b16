import io.netty.bootstrap.ServerBootstrap;
import io.netty.channel.*;
import io.netty.channel.nio.NioEventLoopGroup;
import io.netty.channel.socket.SocketChannel;
import io.netty.channel.socket.nio.NioServerSocketChannel;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

// A Netty 4.1 NIO echo server on 127.0.0.1:PORT whose answers are written
// from a pool of 2 threads: each write is a task submitted to the
// channel's event loop, which its eventfd wakes to run it.
public class NettyTasks {
    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        ExecutorService pool = Executors.newFixedThreadPool(2);
        EventLoopGroup boss = new NioEventLoopGroup(1), workers = new NioEventLoopGroup(2);
        Channel ch = new ServerBootstrap().group(boss, workers).channel(NioServerSocketChannel.class)
            .childHandler(new ChannelInitializer<SocketChannel>() {
                protected void initChannel(SocketChannel ch) {
                    ch.pipeline().addLast(new ChannelInboundHandlerAdapter() {
                        public void channelRead(ChannelHandlerContext ctx, Object msg) {
                            pool.execute(() -> ctx.writeAndFlush(msg));
                        }
                    });
                }
            }).bind("127.0.0.1", port).sync().channel();
        System.out.println("ready");
        ch.closeFuture().sync();
    }
}
