//! Keeping the slices right: external edits and deletes put back, drift repaired after the watch
//! drops, conflicts and server errors converging, the request rate limit, and a restart that
//! finds its slices and writes nothing.

use super::*;

#[tokio::test]
async fn an_external_edit_is_put_back() {
    let (server, _) = server_with_node().await;
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();
    publisher
        .publish(&inventory((0..200).map(plain).collect()))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    let expected: Vec<Vec<String>> = slices(&server).iter().map(device_names).collect();

    let mut edited = slices(&server)[1].clone();
    edited["spec"]["devices"] = json!([{"name": "intruder"}]);
    server.put_raw(Resource::ResourceSlices, edited).unwrap();

    eventually("the edited slice to be repaired", || {
        let now = slices(&server);
        now.iter().map(device_names).collect::<Vec<_>>() == expected
            && generations(&server) == vec![2, 2]
    })
    .await;
    // The server holds the repair before the publisher has read its answer.
    eventually("the updates to be counted", || {
        publisher.stats().updates >= 2
    })
    .await;
    task.stop().await;
}

#[tokio::test]
async fn an_external_delete_is_put_back() {
    let (server, _) = server_with_node().await;
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();
    publisher
        .publish(&inventory((0..200).map(plain).collect()))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    let name = slices(&server)[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    server
        .delete_raw(Resource::ResourceSlices, None, &name)
        .unwrap();

    eventually("the deleted slice to be re-created", || {
        layout(&server) == vec![128, 72] && generations(&server) == vec![2, 2]
    })
    .await;
    eventually("the create to be counted", || {
        publisher.stats().creates == 3
    })
    .await;
    task.stop().await;
}

#[tokio::test]
async fn drift_is_repaired_after_the_watch_is_dropped() {
    let (server, _) = server_with_node().await;
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();
    publisher
        .publish(&inventory((0..10).map(plain).collect()))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    server.drop_watches();
    let name = slices(&server)[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    server
        .delete_raw(Resource::ResourceSlices, None, &name)
        .unwrap();
    eventually("the slice to be re-created after the watch resumed", || {
        layout(&server) == vec![10]
    })
    .await;
    task.stop().await;
}

#[tokio::test]
async fn conflicts_and_server_errors_converge() {
    let (server, _) = server_with_node().await;
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();
    publisher
        .publish(&inventory((0..300).map(plain).collect()))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();

    server.fail_next(Verb::Update, Resource::ResourceSlices, 2, Fault::Conflict);
    server.fail_next(
        Verb::Update,
        Resource::ResourceSlices,
        2,
        Fault::InternalError,
    );
    server.fail_next(
        Verb::Create,
        Resource::ResourceSlices,
        1,
        Fault::ServiceUnavailable,
    );
    server.fail_next(Verb::Get, Resource::ResourceSlices, 1, Fault::InternalError);

    // 400 devices: three slices updated, one created.
    publisher
        .publish(&inventory((0..400).map(plain).collect()))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    assert_eq!(layout(&server), vec![128, 128, 128, 16]);
    assert_eq!(generations(&server), vec![2, 2, 2, 2]);
    let stats = publisher.stats();
    assert!(stats.conflicts >= 2, "{stats:?}");
    assert!(stats.errors >= 3, "{stats:?}");
    assert_eq!(publisher.last_error(), None);
    task.stop().await;
}

#[tokio::test]
async fn a_real_conflict_with_another_writer_converges() {
    let (server, _) = server_with_node().await;
    let publisher = publisher(&server).with_sync_delay(Duration::from_secs(30));
    let task = publisher.start().unwrap();
    publisher
        .publish(&inventory((0..10).map(plain).collect()))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();

    // Another client edits the slice and we publish a change at once: our update carries the
    // old resourceVersion and meets a 409, then must re-read and win.
    let mut edited = slices(&server)[0].clone();
    edited["metadata"]["labels"] = json!({"touched": "yes"});
    server.put_raw(Resource::ResourceSlices, edited).unwrap();
    publisher
        .publish(&inventory((0..11).map(plain).collect()))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    eventually("the change to land", || layout(&server) == vec![11]).await;
    task.stop().await;
}

#[tokio::test]
async fn requests_are_rate_limited() {
    let (server, _) = server_with_node().await;
    let publisher = publisher(&server).with_rate_limit(5.0, 1);
    let task = publisher.start().unwrap();
    let start = Instant::now();
    // A node lookup and four creates: five requests at 5/s with no burst take at least 0.8 s.
    publisher
        .publish(&inventory((0..500).map(plain).collect()))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    assert_eq!(layout(&server).len(), 4);
    assert!(
        start.elapsed() >= Duration::from_millis(790),
        "{:?}",
        start.elapsed()
    );
    task.stop().await;
}

#[tokio::test]
async fn a_restart_finds_its_slices_and_writes_nothing() {
    let (server, _) = server_with_node().await;
    let devices = inventory((0..300).map(plain).collect());
    {
        let publisher = publisher(&server);
        let task = publisher.start().unwrap();
        publisher.publish(&devices).await.unwrap();
        publisher.wait_synced(WAIT).await.unwrap();
        task.stop().await;
    }
    // Nothing stored changes: the restarted publisher only reads (and asks, with dry runs,
    // what the server keeps).
    let before = server.resource_version();
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();
    publisher.publish(&devices).await.unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    assert_eq!(server.resource_version(), before);
    let stats = publisher.stats();
    assert_eq!((stats.creates, stats.updates, stats.deletes), (0, 0, 0));
    assert_eq!(generations(&server), vec![1, 1, 1]);
    task.stop().await;
}
