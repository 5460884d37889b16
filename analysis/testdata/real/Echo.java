import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.channel.*;
import io.netty.channel.nio.NioEventLoopGroup;
import io.netty.channel.socket.SocketChannel;
import io.netty.channel.socket.nio.NioServerSocketChannel;

// A Netty NIO echo server on 127.0.0.1:PORT with 2 worker loops.
public class Echo {
    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        EventLoopGroup boss = new NioEventLoopGroup(1), workers = new NioEventLoopGroup(2);
        new ServerBootstrap().group(boss, workers).channel(NioServerSocketChannel.class)
            .childHandler(new ChannelInitializer<SocketChannel>() {
                protected void initChannel(SocketChannel ch) {
                    ch.pipeline().addLast(new ChannelInboundHandlerAdapter() {
                        public void channelRead(ChannelHandlerContext ctx, Object msg) { ctx.writeAndFlush(msg); }
                    });
                }
            }).bind("127.0.0.1", port).sync().channel().closeFuture().sync();
    }
}
